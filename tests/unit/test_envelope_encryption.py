"""Envelope encryption of event content (turnlog/crypto): seal, open, bind, rotate, refuse."""

import json
import os
import stat

import msgspec
import pytest

from turnlog.crypto.envelope import EpochSealer, EventOpener, SealedContentError
from turnlog.crypto.keys import (
    FileKekProvider,
    KekPublicKey,
    KekRing,
    KeyMaterialError,
    create_keyring_file,
    generate_private_key,
    kek_ring_from_text,
    parse_public_key,
    private_key_text,
    public_key_text,
    rotate_keyring_file,
)
from turnlog.schemas import EventValidationError, ToolCall, decode_event, encode_event
from turnlog.schemas.events import with_content

from tests.support import EventFactory

SECRET = "my IBAN is DE89370400440532013000 and I live at 12 Elm Street"


def ring_and_public():
    private = generate_private_key()
    return KekRing([private]), KekPublicKey.of(private.public_key())


def samples(factory):
    completed = msgspec.structs.replace(
        factory.completed(2, 0, SECRET),
        tool_calls=[ToolCall(name="lookup", arguments={"street": "Elm"}, result={"found": SECRET})],
    )
    started = msgspec.structs.replace(factory.started(), metadata={"caller": SECRET})
    return [started, factory.partial(1, 0, SECRET[:20]), completed, factory.ended(3, last_turn=0)]


def test_every_event_opens_to_what_its_writer_built_and_the_wire_holds_no_content():
    ring, public = ring_and_public()
    factory = EventFactory("s-seal")
    sealer, opener = EpochSealer(public, factory.session_id, 0), EventOpener(ring)
    for event in samples(factory):
        wire = encode_event(sealer.seal(event))
        # Each clear form holds a space or a quote, which base64 ciphertext never does: a random
        # ciphertext cannot contain one by chance (a bare b"Elm" can).
        assert b"Elm Street" not in wire and b'"Elm"' not in wire and b"IBAN is" not in wire
        assert b"DE89370400440532013000" not in wire
        decoded = decode_event(wire)  # a plain v3 event to every reader: orderable without a key
        assert (decoded.session_id, decoded.seq, decoded.epoch) == (event.session_id, event.seq, event.epoch)
        assert opener.open(decoded) == event
    ended = samples(factory)[-1]
    assert sealer.seal(ended) is ended  # nothing to seal


def test_a_sealed_event_is_version_3_and_its_content_fields_are_empty_on_the_wire():
    ring, public = ring_and_public()
    factory = EventFactory("s-v3")
    sealed = EpochSealer(public, factory.session_id, 0).seal(factory.completed(1, 0, SECRET, barged_in=True))
    raw = json.loads(encode_event(sealed))
    assert raw["schema_version"] == 3 and raw["text"] == "" and "tool_calls" not in raw
    assert raw["barged_in"] is True and raw["input_tokens"] == 3  # what is not content stays in clear
    assert set(raw["sealed"]) == {"kek", "key", "box"} and raw["sealed"]["kek"] == ring.current.id
    opened = EventOpener(ring).open(decode_event(encode_event(sealed)))
    assert opened.schema_version == 2 and opened.text == SECRET  # the version its writer's plain event had


def test_a_box_moved_to_another_event_or_session_does_not_open():
    ring, public = ring_and_public()
    factory = EventFactory("s-a")
    sealer, opener = EpochSealer(public, "s-a", 0), EventOpener(ring)
    first, second = sealer.seal(factory.partial(1, 0, "alpha")), sealer.seal(factory.partial(2, 0, "beta"))
    moved = msgspec.structs.replace(second, sealed=first.sealed)
    with pytest.raises(SealedContentError, match="s-a epoch 0 seq 2"):
        opener.open(moved)
    other = EventFactory("s-b").partial(1, 0, "")
    with pytest.raises(SealedContentError, match="s-b epoch 0: the wrapped data key does not open"):
        opener.open(msgspec.structs.replace(other, sealed=first.sealed, schema_version=msgspec.UNSET))
    other_epoch = msgspec.structs.replace(first, epoch=1)
    with pytest.raises(SealedContentError, match="does not open"):
        opener.open(other_epoch)


def test_a_tampered_box_fails_and_the_error_names_the_session_not_the_content():
    ring, public = ring_and_public()
    event = EpochSealer(public, "s-t", 0).seal(EventFactory("s-t").partial(1, 0, SECRET))
    box = bytearray(event.sealed.box)
    box[-1] ^= 1
    tampered = msgspec.structs.replace(event, sealed=msgspec.structs.replace(event.sealed, box=bytes(box)))
    with pytest.raises(SealedContentError) as caught:
        EventOpener(ring).open(tampered)
    assert "s-t" in str(caught.value) and "Elm" not in str(caught.value)
    assert isinstance(caught.value, EventValidationError)  # routed as one bad record by every reader


def test_a_kek_the_ring_does_not_hold_is_named():
    _, public = ring_and_public()
    other_ring, _ = ring_and_public()
    event = EpochSealer(public, "s-k", 0).seal(EventFactory("s-k").partial(1, 0, "x"))
    with pytest.raises(SealedContentError, match=f"KEK {public.id}, which this process's keyring does not hold"):
        EventOpener(other_ring).open(event)


def test_after_a_rotation_the_ring_opens_old_and_new_and_wraps_with_the_new(tmp_path):
    path = tmp_path / "kek"
    first = create_keyring_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    old_event = EpochSealer(first, "s-r", 0).seal(EventFactory("s-r").partial(1, 0, "before"))
    second = rotate_keyring_file(path)
    provider = FileKekProvider(path)
    assert provider.public_key().id == second.id != first.id
    assert provider.ring().ids == (second.id, first.id)
    new_event = EpochSealer(provider.public_key(), "s-r", 1).seal(EventFactory("s-r").partial(2, 0, "after", epoch=1))
    opener = EventOpener(provider.ring())
    assert [opener.open(e).text for e in (old_event, new_event)] == ["before", "after"]
    with pytest.raises(KeyMaterialError, match="exists"):
        create_keyring_file(path)


def test_a_keyring_readable_by_others_or_malformed_is_refused_without_showing_key_bytes(tmp_path):
    path = tmp_path / "kek"
    key_text = private_key_text(generate_private_key())
    path.write_text(key_text + "\n")
    os.chmod(path, 0o644)
    with pytest.raises(KeyMaterialError, match="chmod 600"):
        FileKekProvider(path)
    os.chmod(path, 0o600)
    assert FileKekProvider(path).ring().current.id
    path.write_text(f"# comment\n{key_text}\nx25519-private:not-a-key\n")
    with pytest.raises(KeyMaterialError, match="line 3") as caught:
        FileKekProvider(path)
    assert key_text.split(":")[1] not in str(caught.value)
    with pytest.raises(KeyMaterialError, match="no keyring"):
        FileKekProvider(tmp_path / "missing")
    with pytest.raises(KeyMaterialError, match="holds no key"):
        kek_ring_from_text("# nothing\n")


def test_public_key_text_round_trips_and_a_private_text_gives_its_public_half():
    private = generate_private_key()
    public = KekPublicKey.of(private.public_key())
    assert parse_public_key(public_key_text(private.public_key())).id == public.id
    assert parse_public_key(private_key_text(private)).id == public.id
    for bad in ("x25519:AAAA", "rsa:abc", "x25519:!!!"):
        with pytest.raises(KeyMaterialError):
            parse_public_key(bad)


def test_opened_content_is_checked_as_a_plain_event_is():
    factory = EventFactory("s-c")
    sealed_turn = EpochSealer(ring_and_public()[1], "s-c", 0).seal(factory.partial(1, 0, "x"))
    with pytest.raises(EventValidationError, match="holds metadata"):
        with_content(sealed_turn, b'{"text":"x","metadata":{"a":1}}')
    with pytest.raises(EventValidationError, match="nests deeper"):
        with_content(sealed_turn, b'{"text":"x","metadata":' + b"[" * 40 + b"]" * 40 + b"}")
    with pytest.raises(EventValidationError, match="sealed content"):
        with_content(sealed_turn, b'{"text":"a\\u0000b"}')
    with pytest.raises(EventValidationError, match="sealed content"):
        with_content(sealed_turn, b"not json")


def test_a_sealed_event_with_content_beside_it_is_refused_by_the_decoder():
    event = EpochSealer(ring_and_public()[1], "s-d", 0).seal(EventFactory("s-d").partial(1, 0, "x"))
    raw = json.loads(encode_event(event))
    raw["text"] = "leaked beside the box"
    with pytest.raises(EventValidationError, match="sealed only"):
        decode_event(json.dumps(raw))


def test_the_data_key_cache_is_bounded_and_each_epoch_is_unwrapped_once():
    ring, public = ring_and_public()
    opener = EventOpener(ring, cache_entries=2)
    events = [EpochSealer(public, f"s-{i}", 0).seal(EventFactory(f"s-{i}").partial(1, 0, f"t{i}")) for i in range(4)]
    assert [opener.open(e).text for e in events] == ["t0", "t1", "t2", "t3"]
    assert len(opener._cache) == 2
