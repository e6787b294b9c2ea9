"""Envelope encryption of event content: one data key per session epoch, wrapped for a KEK.

The scheme (docs/design.md, "Encryption and erasure"):

* **Data key.** Each recorder draws a random 256-bit AES key for each session
  epoch it writes (:class:`EpochSealer`): never derived from anything, so
  destroying every copy of it destroys the content (crypto-shredding).
* **Wrapping.** The data key is encrypted for the current KEK's public half
  with HPKE (RFC 9180, base mode: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
  AES-256-GCM), ``cryptography``'s implementation. HPKE's ``info`` binds the
  wrapped key to its session and epoch: moved onto another session it does
  not open.
* **Sealing.** An event's content (``turnlog.schemas.content_of``) is
  encrypted with AES-256-GCM under the data key, a fresh random 96-bit nonce
  per event (an epoch writes far fewer than the 2^32 events a random nonce
  allows per key), and as associated data the event's clear identity (type,
  session, epoch, seq, event id): a box moved onto another event does not
  open. Every event carries its wrapped data key (``Sealed.key``), so each
  record opens alone: from any offset, in any order, after any neighbour
  went to the DLQ.
* **Opening.** :class:`EventOpener` unwraps a data key once per session epoch
  and process (an LRU of :data:`DATA_KEY_CACHE_ENTRIES` keys) and opens boxes
  with it.

Errors name the session, the epoch and the KEK id, never key bytes or content.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import OrderedDict
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite

from turnlog.crypto.keys import KekPublicKey, KekRing
from turnlog.schemas.events import Event, Sealed, content_of, with_content, without_content
from turnlog.schemas.exceptions import EventValidationError
from turnlog.signing import framed

__all__ = [
    "EpochSealer", "EventOpener", "SealedContentError", "open_sealed", "is_sealed", "DATA_KEY_CACHE_ENTRIES",
    "NONCE_BYTES",
]

_SUITE: Final = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.AES_256_GCM)
_KEY_DOMAIN: Final = b"turnlog-data-key-v1"
_CONTENT_DOMAIN: Final = b"turnlog-sealed-content-v1"
NONCE_BYTES: Final = 12
#: Data keys an :class:`EventOpener` keeps unwrapped (each well under 1 KiB with its cache key).
DATA_KEY_CACHE_ENTRIES: Final = 4096


class SealedContentError(EventValidationError):
    """A sealed event cannot be opened: no private KEK for its id, a wrapped key or a box
    that does not authenticate (tampered with, or moved from another event or session).
    An :class:`~turnlog.schemas.EventValidationError`, so every reader routes it as one
    bad record (the DLQ), never as its own failure."""


def _key_info(session_id: str, epoch: int) -> bytes:
    return framed(_KEY_DOMAIN, session_id.encode("utf-8"), str(epoch).encode("ascii"))


def _associated_data(tag: str, session_id: str, epoch: int, seq: int, event_id: uuid.UUID) -> bytes:
    return framed(
        _CONTENT_DOMAIN, tag.encode("utf-8"), session_id.encode("utf-8"), str(epoch).encode("ascii"),
        str(seq).encode("ascii"), event_id.bytes,
    )


def _identity(event: Event) -> bytes:
    return _associated_data(str(event.__struct_config__.tag), event.session_id, event.epoch, event.seq, event.event_id)


class EpochSealer:
    """The writer's side for one session epoch: a fresh data key, wrapped once for ``kek``."""

    def __init__(self, kek: KekPublicKey, session_id: str, epoch: int) -> None:
        data_key = AESGCM.generate_key(bit_length=256)
        self._aead = AESGCM(data_key)
        self._kek_id = kek.id
        self._wrapped = _SUITE.encrypt(data_key, kek.key, info=_key_info(session_id, epoch))
        self.session_id = session_id
        self.epoch = epoch

    def seal(self, event: Event) -> Event:
        """``event`` with its content encrypted into ``sealed`` (``SessionEnded`` unchanged).

        Raises:
            ValueError: ``event`` belongs to another session or epoch.
        """
        if event.session_id != self.session_id or event.epoch != self.epoch:
            raise ValueError("the event belongs to another session epoch than this sealer's")
        try:
            plaintext = content_of(event)
        except TypeError:
            return event  # no content (session.ended)
        nonce = os.urandom(NONCE_BYTES)
        box = nonce + self._aead.encrypt(nonce, plaintext, _identity(event))
        return without_content(event, Sealed(kek=self._kek_id, key=self._wrapped, box=box))


class EventOpener:
    """The reader's side: opens sealed events with the private KEKs of ``ring``.

    Thread-safe: the cache is used under a lock (two threads may still unwrap the
    same key once each).
    """

    def __init__(self, ring: KekRing, *, cache_entries: int = DATA_KEY_CACHE_ENTRIES) -> None:
        self.ring = ring
        self._cache: OrderedDict[tuple[str, int, str, bytes], AESGCM] = OrderedDict()
        self._cache_entries = cache_entries
        self._lock = threading.Lock()

    def open(self, event: Event) -> Event:
        """``event`` as its writer built it: content back in place, ``sealed`` gone.
        An event that is not sealed is returned as it is.

        Raises:
            SealedContentError: the KEK is not in this ring, or the key or box does not open.
            EventValidationError: the opened content is not valid for the event (its bounds).
        """
        sealed = getattr(event, "sealed", None)
        if sealed is None:
            return event
        aead = self._data_key(event.session_id, event.epoch, sealed)
        box = sealed.box
        try:
            plaintext = aead.decrypt(box[:NONCE_BYTES], box[NONCE_BYTES:], _identity(event))
        except InvalidTag:
            raise SealedContentError(
                f"session {event.session_id} epoch {event.epoch} seq {event.seq}: the sealed content does not "
                "authenticate (altered, or moved from another event)"
            ) from None
        return with_content(event, plaintext)

    def _data_key(self, session_id: str, epoch: int, sealed: Sealed) -> AESGCM:
        cache_key = (session_id, epoch, sealed.kek, sealed.key)
        with self._lock:
            aead = self._cache.get(cache_key)
            if aead is not None:
                self._cache.move_to_end(cache_key)
                return aead
        private = self.ring.private_key(sealed.kek)
        if private is None:
            raise SealedContentError(
                f"session {session_id} epoch {epoch}: its data key is wrapped for KEK {sealed.kek}, which this "
                f"process's keyring does not hold (it holds {', '.join(self.ring.ids)})"
            )
        try:
            data_key = _SUITE.decrypt(sealed.key, private, info=_key_info(session_id, epoch))
        except Exception:  # HPKE's open failed: a wrong or altered key, or another session's
            raise SealedContentError(
                f"session {session_id} epoch {epoch}: the wrapped data key does not open with KEK {sealed.kek}"
            ) from None
        if len(data_key) != 32:
            raise SealedContentError(f"session {session_id} epoch {epoch}: the data key is not 256 bits")
        aead = AESGCM(data_key)
        with self._lock:
            self._cache[cache_key] = aead
            if len(self._cache) > self._cache_entries:
                self._cache.popitem(last=False)
        return aead


def is_sealed(event: Event) -> bool:
    """Whether ``event`` carries its content sealed."""
    return getattr(event, "sealed", None) is not None


def open_sealed(event: Event, opener: EventOpener | None) -> Event:
    """``event`` opened by ``opener`` if it is sealed, else ``event`` itself.

    Raises:
        SealedContentError: sealed, and ``opener`` is None (this process has no keyring),
            or as :meth:`EventOpener.open`.
        EventValidationError: as :meth:`EventOpener.open`.
    """
    if not is_sealed(event):
        return event
    if opener is None:
        raise SealedContentError(
            f"session {event.session_id} seq {event.seq}: the content is sealed and this process has no keyring "
            "(TURNLOG_KEYRING_FILE)"
        )
    return opener.open(event)
