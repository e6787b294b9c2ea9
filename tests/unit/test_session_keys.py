"""Session keys (schemas/session_keys.py): a session is named by its fleet and its id."""

import pytest

from turnlog.schemas import SessionStarted
from turnlog.schemas.events import decode_event, encode_event
from turnlog.schemas.session_keys import (
    MAX_AGENT_SESSION_ID,
    MAX_FLEET_IN_KEY,
    MAX_SESSION_KEY,
    SessionKeyError,
    grants_as,
    in_namespace,
    key_namespace,
    local_id,
    session_key,
)

from tests.support import EventFactory


def test_two_fleets_name_the_same_id_as_two_sessions():
    assert session_key("fleet-a", "call-1") == "fleet-a:call-1"
    assert session_key("fleet-a", "call-1") != session_key("fleet-b", "call-1")
    # an id may hold ':' (a SIP URI, a room name): the fleet ends at the key's first ':'
    assert session_key("a", "sip:1") != session_key("a.sip", "1")
    assert key_namespace(session_key("a", "sip:1")) == "a"
    assert local_id("a", session_key("a", "sip:1")) == "sip:1"


@pytest.mark.parametrize("fleet", ["", "a:b", "fleet a", "-a", "x" * (MAX_FLEET_IN_KEY + 1), "fl\u00e9et"])
def test_a_fleet_that_cannot_name_sessions_is_refused_with_the_rule(fleet):
    with pytest.raises(SessionKeyError, match="no ':'"):
        session_key(fleet, "call-1")


@pytest.mark.parametrize("session_id", ["", "a/b", "a\n", "-a", "x" * (MAX_AGENT_SESSION_ID + 1)])
def test_an_id_that_is_not_an_agents_id_is_refused(session_id):
    with pytest.raises(SessionKeyError, match="session id"):
        session_key("a", session_id)


def test_the_longest_key_is_a_valid_event_session_id():
    key = session_key("f" * MAX_FLEET_IN_KEY, "s" * MAX_AGENT_SESSION_ID)
    assert len(key) == MAX_SESSION_KEY
    event = EventFactory(key).started()
    assert isinstance(decode_event(encode_event(event)), SessionStarted)


def test_namespaces_of_keys_and_of_bare_ids():
    assert in_namespace("a", "a:x") and not in_namespace("a", "ab:x") and not in_namespace("a", "a:")
    assert key_namespace("x") is None and key_namespace(":x") is None and key_namespace("a:") is None
    assert local_id("b", "a:x") == "a:x"  # not b's key: shown as it is


def test_a_resume_of_a_key_may_continue_that_fleets_session_from_before_keys_only():
    assert grants_as("a:x", "a:x", "a")
    assert grants_as("a:x", "x", "a")  # the bare id of fleet a's session from before keys
    assert not grants_as("a:x", "x", "b")  # another fleet's bare x
    assert not grants_as("a:x", "y", "a") and not grants_as("x", "a:x", "a")
