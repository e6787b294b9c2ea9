"""Encryption of event content at rest and in flight (envelope encryption, crypto-shredding):
key encryption keys and their providers (:mod:`turnlog.crypto.keys`), data keys, sealing and
opening (:mod:`turnlog.crypto.envelope`)."""

from turnlog.crypto.envelope import EpochSealer, EventOpener, SealedContentError, is_sealed, open_sealed
from turnlog.crypto.keys import (
    FileKekProvider,
    KekProvider,
    KekPublicKey,
    KekRing,
    KeyMaterialError,
    kek_ring_from_text,
    parse_public_key,
)

__all__ = [
    "EpochSealer",
    "EventOpener",
    "FileKekProvider",
    "KekProvider",
    "KekPublicKey",
    "KekRing",
    "KeyMaterialError",
    "SealedContentError",
    "is_sealed",
    "open_sealed",
    "kek_ring_from_text",
    "parse_public_key",
]
