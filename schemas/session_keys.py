"""A session's identity is its fleet and the id its agent gave it: the *session key*.

Two fleets on one deployment pick ids independently (room names, call ids from the
same telephony provider), so an id alone does not name a session. The recorder
writes every event of a session under its key, ``<fleet>:<id>``
(:func:`session_key`): the events' ``session_id``, the Kafka key (and so the
partition), the sequencer's state, the store's rows, the API's paths, the erasure
ledger, replay and verify all use it, and need not know how it was made. Two
fleets' sessions with the same id are two sessions.

The sequencer enforces the namespaces: with fleet keys, a new session whose key is
in a fleet's namespace (:func:`key_namespace`) is admitted only from that fleet, so
no fleet can take another's id.

A fleet that names sessions has a *key-safe* name (:data:`FLEET_IN_KEY_PATTERN`: no
``:``, so the first ``:`` of a key ends its fleet, and at most
:data:`MAX_FLEET_IN_KEY` characters). A session started before per-fleet keys keeps
the bare id it was written under: its fleet is in its stored row and in the
sequencer's state, and every reader goes on finding it by that id
(docs/design.md, "Session keys").
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_AGENT_SESSION_ID", "MAX_FLEET_IN_KEY", "MAX_SESSION_KEY", "FLEET_IN_KEY_PATTERN",
           "AGENT_SESSION_ID_PATTERN", "SessionKeyError", "session_key", "in_namespace", "key_namespace",
           "bare_id", "grants_as", "local_id"]

#: Longest id an agent gives a session (characters).
MAX_AGENT_SESSION_ID: Final = 200
#: Longest fleet name that can name sessions (characters).
MAX_FLEET_IN_KEY: Final = 64
#: Longest session key: a fleet, ``:`` and an agent's id.
MAX_SESSION_KEY: Final = MAX_FLEET_IN_KEY + 1 + MAX_AGENT_SESSION_ID
#: What an agent's session id may hold (ASCII letters, digits and ``._:@-``, first a letter or digit).
AGENT_SESSION_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
#: What a fleet that names sessions may hold: as an id, without ``:``.
FLEET_IN_KEY_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._@-]*$"

_AGENT_ID = re.compile(AGENT_SESSION_ID_PATTERN.removesuffix("$") + r"\Z")
_FLEET = re.compile(FLEET_IN_KEY_PATTERN.removesuffix("$") + r"\Z")


class SessionKeyError(ValueError):
    """A fleet or an id that cannot make a session key (the message names the rule, not the value)."""


def session_key(fleet: str, session_id: str) -> str:
    """The key of fleet ``fleet``'s session ``session_id``: ``"<fleet>:<session_id>"``.

    Raises:
        SessionKeyError: ``fleet`` is not key-safe (:data:`FLEET_IN_KEY_PATTERN`, 1 to
            :data:`MAX_FLEET_IN_KEY` characters), or ``session_id`` is not an agent's id
            (:data:`AGENT_SESSION_ID_PATTERN`, 1 to :data:`MAX_AGENT_SESSION_ID` characters).
    """
    if not (isinstance(fleet, str) and 1 <= len(fleet) <= MAX_FLEET_IN_KEY and _FLEET.match(fleet)):
        raise SessionKeyError(
            f"a fleet that names sessions is 1 to {MAX_FLEET_IN_KEY} characters of ASCII letters, digits and "
            "'._@-' (no ':'), first a letter or a digit"
        )
    if not (isinstance(session_id, str) and 1 <= len(session_id) <= MAX_AGENT_SESSION_ID
            and _AGENT_ID.match(session_id)):
        raise SessionKeyError(
            f"a session id is 1 to {MAX_AGENT_SESSION_ID} characters of ASCII letters, digits and '._:@-', "
            "first a letter or a digit"
        )
    return f"{fleet}:{session_id}"


def in_namespace(fleet: str, key: str) -> bool:
    """Whether ``key`` is one of ``fleet``'s session keys (it begins with ``"<fleet>:"``)."""
    return key.startswith(fleet + ":") and len(key) > len(fleet) + 1


def key_namespace(key: str) -> str | None:
    """The fleet whose namespace ``key`` is in (the part before its first ``:``), or None for a key
    with no ``:`` (a bare id from before per-fleet keys). A bare id holding a ``:`` looks like a
    key: only a fleet of that name could start such a session."""
    fleet, colon, rest = key.partition(":")
    return fleet if colon and fleet and rest else None


def bare_id(key: str) -> str | None:
    """The id ``key`` names in its fleet's namespace (``key`` without ``<fleet>:``), or None for a key
    in no namespace: the bare id a session of that fleet had before per-fleet keys."""
    namespace = key_namespace(key)
    return local_id(namespace, key) if namespace is not None else None


def grants_as(key: str, granted: str, fleet: str | None) -> bool:
    """Whether a resume of ``key`` may continue the session ``granted`` of fleet ``fleet``: the same
    key, or the bare id ``key`` names in its fleet's namespace, held by that fleet (a session from
    before per-fleet keys; the resume barrier resolves ``<fleet>:<id>`` to it)."""
    return granted == key or (fleet == key_namespace(key) and granted == bare_id(key))


def local_id(fleet: str, key: str) -> str:
    """The id ``fleet``'s agent gave the session keyed ``key``: the key without its fleet, or
    ``key`` itself when it is not in ``fleet``'s namespace (a session from before per-fleet keys)."""
    return key[len(fleet) + 1:] if in_namespace(fleet, key) else key
