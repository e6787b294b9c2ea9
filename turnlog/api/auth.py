"""Bearer-token access control of the HTTP API, scoped by fleet.

Tokens come from ``TURNLOG_API_TOKENS`` (``{token: [fleet, ...]}``; ``"*"`` is
every fleet). A request without a valid token gets 401; a session outside the
token's fleets is answered exactly as a session that does not exist (404), so
a token cannot even learn that another fleet's session id is in use.

Comparison is constant-time: the SHA-256 digests of the presented token and
of every known token are compared with :func:`hmac.compare_digest`, all of
them, whatever matches. Tokens are never logged: nothing here logs, and the
API accepts them only in the ``Authorization`` header, never in a URL (which
access logs record).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Scope", "TokenTable", "ALL_FLEETS", "TOKEN_ID_HEX_DIGITS"]

ALL_FLEETS = "*"


#: Hex digits of a token's SHA-256 in its :attr:`Scope.token_id`.
TOKEN_ID_HEX_DIGITS = 12


@dataclass(frozen=True, slots=True)
class Scope:
    """What one token may read: ``fleets`` (None: every fleet). ``token_number`` is the
    token's position in ``TURNLOG_API_TOKENS`` (from 1; 0: no table), the key of the
    API's per-token limits: it names the token without holding it. ``token_id``: the
    first ``TOKEN_ID_HEX_DIGITS`` hex digits of the token's SHA-256, stable across
    restarts and reorderings of the table, what an audit record names (``api:<token_id>``
    in an erasure's ``requested_by``); it does not reveal the token."""

    fleets: frozenset[str] | None
    token_number: int = 0
    token_id: str = ""

    def allows(self, fleet: str | None) -> bool:
        return self.fleets is None or (fleet is not None and fleet in self.fleets)


class TokenTable:
    """The API's tokens, held as digests."""

    def __init__(self, tokens: Mapping[str, Sequence[str]]) -> None:
        self._entries: list[tuple[bytes, Scope]] = []
        for number, (token, fleets) in enumerate(tokens.items(), start=1):
            if token:
                digest = hashlib.sha256(token.encode("utf-8")).digest()
                scope = Scope(None if ALL_FLEETS in fleets else frozenset(fleets), number,
                              digest.hex()[:TOKEN_ID_HEX_DIGITS])
                self._entries.append((digest, scope))

    def __len__(self) -> int:
        return len(self._entries)

    def scope_of(self, authorization: str | None) -> Scope | None:
        """The scope of an ``Authorization: Bearer <token>`` header value, or None if it grants nothing."""
        if not authorization:
            return None
        kind, _, token = authorization.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            return None
        presented = hashlib.sha256(token.strip().encode("utf-8")).digest()
        granted: Scope | None = None
        for digest, scope in self._entries:  # no early exit: every token is compared
            if hmac.compare_digest(digest, presented):
                granted = scope
        return granted
