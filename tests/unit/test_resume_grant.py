import datetime as dt
import json

import msgspec
import pytest

from turnlog.producers.grant import ResumeGrant, StoredTurn, decode_grant, encode_grant

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)


def grant() -> ResumeGrant:
    return ResumeGrant(
        session_id="call-42",
        epoch=3,
        status="active",
        last_seq=17,
        max_turn_index=2,
        turns=(
            StoredTurn(0, "user", "héllo, \"quoted\"\n", "complete", T0, T0 + dt.timedelta(seconds=2), 5, 0, None),
            StoredTurn(
                1, "agent", "let me look", "complete", T0 + dt.timedelta(seconds=3), T0 + dt.timedelta(seconds=4), 12, 40,
                ({"name": "lookup", "arguments": {"id": 7}, "result": "found"},), barged_in=True,
            ),
            StoredTurn(2, "user", "and th", "partial", T0 + dt.timedelta(seconds=5), None, 0, 0, None),
        ),
    )


def test_a_grant_survives_its_json_round_trip_exactly():
    original = grant()
    encoded = encode_grant(original)
    decoded = decode_grant(encoded)
    assert decoded == original
    assert decoded.turns[0].started_at.tzinfo is not None and decoded.turns[0].started_at == T0  # microseconds kept
    assert decoded.turns[1].tool_calls == ({"name": "lookup", "arguments": {"id": 7}, "result": "found"},)
    assert (decoded.next_seq, decoded.next_turn_index, decoded.resumable) == (18, 3, True)
    body = json.loads(encoded)  # plain JSON for any other client
    assert [t["turn_index"] for t in body["turns"]] == [0, 1, 2]
    assert body["turns"][2]["ended_at"] is None and body["turns"][1]["barged_in"] is True


def test_a_grant_without_turns_starts_at_turn_zero():
    empty = ResumeGrant("s", epoch=1, status="active", last_seq=0, max_turn_index=None)
    assert decode_grant(encode_grant(empty)) == empty
    assert (empty.next_seq, empty.next_turn_index) == (1, 0)
    assert not ResumeGrant("s", epoch=1, status="ended", last_seq=4, max_turn_index=1).resumable


def test_decoding_tolerates_an_older_and_a_newer_server():
    body = json.loads(encode_grant(grant()))
    for turn in body["turns"]:
        del turn["barged_in"]  # a server from before the barged_in column
        turn["sentiment"] = "calm"  # a field this client does not know yet
    body["fleet"] = "support"
    decoded = decode_grant(json.dumps(body))
    assert [t.barged_in for t in decoded.turns] == [False, False, False]
    assert [t.text for t in decoded.turns] == [t.text for t in grant().turns]


@pytest.mark.parametrize("body", [b"not json", b"{}", b'{"session_id": "s", "epoch": "one", "status": "active", "last_seq": 0, "max_turn_index": null}'])
def test_a_body_that_is_not_a_grant_is_refused(body):
    with pytest.raises(msgspec.DecodeError):
        decode_grant(body)


def test_a_stored_turn_reads_a_row_with_or_without_the_barged_in_column():
    row = {
        "turn_index": 4, "speaker": "agent", "text": "sure", "status": "complete", "started_at": T0, "ended_at": T0,
        "input_tokens": 1, "output_tokens": 2, "tool_calls": [{"name": "x", "arguments": {}, "result": None}],
        "epoch": 0, "seq": 9,
    }
    before = StoredTurn.from_row(row)
    assert before.barged_in is False and before.tool_calls == ({"name": "x", "arguments": {}, "result": None},)
    assert StoredTurn.from_row({**row, "barged_in": True}).barged_in is True
    assert StoredTurn.from_row({**row, "barged_in": None}).barged_in is False
