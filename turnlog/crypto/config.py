"""The keys a process gets from its settings: the recorder's public KEK, the readers' opener.

``TURNLOG_ENCRYPTION`` (``auto`` by default, ``required``, ``off``) decides, with
``TURNLOG_KEK_PUBLIC_KEY`` and ``TURNLOG_KEYRING_FILE`` (turnlog/settings.py):

* a recorder seals when it has a public KEK: ``kek_public_key``, or else the
  public half of ``keyring_file`` (a single-host setup, where the agent may
  read the keyring); ``off`` never seals;
* a reader (sink, API, replay, verify, tail) opens sealed events with the
  keyring of ``keyring_file`` (or ``keyring``, its text in a secret
  environment variable); without one, each sealed record is refused with a
  reason (the DLQ), never read as empty;
* ``required`` makes a process without its key refuse to start.
"""

from __future__ import annotations

from pathlib import Path

from turnlog.crypto.envelope import EventOpener
from turnlog.crypto.keys import (
    FileKekProvider,
    KekProvider,
    KekPublicKey,
    KeyMaterialError,
    TextKekProvider,
    parse_public_key,
)
from turnlog.settings import TurnlogSettings

__all__ = ["recorder_kek", "event_opener"]


def recorder_kek(settings: TurnlogSettings) -> KekPublicKey | None:
    """The public KEK a recorder wraps data keys with, or None (it writes plain content).

    Raises:
        KeyMaterialError: ``kek_public_key`` or ``keyring_file`` is set and unusable, or
            ``encryption=required`` and neither is set.
    """
    if settings.encryption == "off":
        return None
    if settings.kek_public_key:
        try:
            return parse_public_key(settings.kek_public_key)
        except KeyMaterialError as e:
            raise KeyMaterialError(f"TURNLOG_KEK_PUBLIC_KEY: {e}") from None
    provider = _keyring(settings)
    if provider is not None:
        return provider.public_key()
    if settings.encryption == "required":
        raise KeyMaterialError(
            "TURNLOG_ENCRYPTION=required and no KEK: set TURNLOG_KEK_PUBLIC_KEY (`turnlog keys public` prints it)"
        )
    return None


def event_opener(settings: TurnlogSettings) -> EventOpener | None:
    """The opener of a reader, from ``keyring_file``; None without one.

    Raises:
        KeyMaterialError: ``keyring_file`` is set and unusable (missing, readable by others,
            malformed), it does not hold ``kek_public_key`` (set too: the agents' KEK), or
            ``encryption=required`` and it is not set.
    """
    provider = _keyring(settings)
    if provider is not None:
        ring = provider.ring()
        if settings.kek_public_key:
            agents = recorder_kek(settings)
            if agents is not None and ring.private_key(agents.id) is None:
                where = settings.keyring_file or "TURNLOG_KEYRING"
                raise KeyMaterialError(
                    f"TURNLOG_KEK_PUBLIC_KEY is KEK {agents.id}, which the keyring {where} does not "
                    f"hold (it holds {', '.join(ring.ids)}): what agents write could not be opened here"
                )
        return EventOpener(ring)
    if settings.encryption == "required":
        raise KeyMaterialError(
            "TURNLOG_ENCRYPTION=required and no TURNLOG_KEYRING_FILE (or TURNLOG_KEYRING) to open sealed content with"
        )
    return None


def _keyring(settings: TurnlogSettings) -> KekProvider | None:
    """The private keyring of ``keyring_file`` or ``keyring`` (settings refuse both), or None."""
    if settings.keyring_file:
        return FileKekProvider(Path(settings.keyring_file))
    if settings.keyring is not None:
        return TextKekProvider(settings.keyring.get_secret_value())
    return None
