"""Key encryption keys (KEKs): X25519 key pairs, their ids, and where processes get them.

Who holds what (docs/design.md, "Encryption and erasure"):

* An agent's recorder holds only the current KEK's **public** half. It wraps
  each session epoch's data key with it, so it can write a session's content
  but read none: not another session's, not even its own once written.
* The sink, the API, ``turnlog replay``/``verify``/``tail`` hold the
  **private** halves (a :class:`KekRing`): every KEK that wrapped a data key
  still in the log or the store, the current one first.

A KEK is named by its id: the first 8 bytes, in hex, of SHA-256 over a domain
tag and the public key's 32 raw bytes (:func:`kek_id`). Keys are written as
``x25519:<base64url of the 32 raw bytes>`` (public) and
``x25519-private:<base64url>`` (private), one per line in a keyring file,
newest first.

Key providers: :class:`KekProvider` is the interface (a KMS is a later
implementation); :class:`FileKekProvider` reads a keyring file (mode 0600, this
user's: anything looser is refused), :class:`TextKekProvider` a keyring given
in an environment variable (``TURNLOG_KEYRING``). Rotation (:func:`rotate_keyring_file`) puts a new
key pair first; the old private keys stay to read what they wrapped until the
log and the store no longer hold it.

Nothing here logs or puts key bytes in an error message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

__all__ = [
    "KeyMaterialError",
    "KekPublicKey",
    "KekRing",
    "KekProvider",
    "FileKekProvider",
    "TextKekProvider",
    "kek_id",
    "generate_private_key",
    "public_key_text",
    "private_key_text",
    "parse_public_key",
    "kek_ring_from_text",
    "rotate_keyring_file",
    "create_keyring_file",
]

PUBLIC_PREFIX: Final = "x25519:"
PRIVATE_PREFIX: Final = "x25519-private:"
_KEY_BYTES: Final = 32
_ID_DOMAIN: Final = b"turnlog-kek-id-v1\x00"
#: Longest keyring accepted, in bytes (a key line is ~60 bytes: thousands of rotations).
MAX_KEYRING_BYTES: Final = 256 * 1024


class KeyMaterialError(ValueError):
    """A key or keyring cannot be used; the message says why and names no key bytes."""


def kek_id(public_key: X25519PublicKey) -> str:
    """The KEK's id: 16 hex characters (8 bytes of SHA-256 over a domain tag and the raw public key)."""
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(_ID_DOMAIN + raw).digest()[:8].hex()


@dataclass(frozen=True)
class KekPublicKey:
    """The public half of a KEK, as a recorder holds it: wraps data keys, opens nothing."""

    key: X25519PublicKey
    id: str

    @classmethod
    def of(cls, key: X25519PublicKey) -> KekPublicKey:
        return cls(key, kek_id(key))


class KekRing:
    """Private KEKs by id, the current (newest) first: what readers unwrap data keys with.

    Raises:
        KeyMaterialError: (constructor) no key, or two keys with the same id.
    """

    def __init__(self, private_keys: Sequence[X25519PrivateKey]) -> None:
        if not private_keys:
            raise KeyMaterialError("the keyring holds no key")
        self._by_id: dict[str, X25519PrivateKey] = {}
        for key in private_keys:
            identifier = kek_id(key.public_key())
            if identifier in self._by_id:
                raise KeyMaterialError(f"the keyring holds KEK {identifier} twice")
            self._by_id[identifier] = key
        self.current = KekPublicKey.of(private_keys[0].public_key())

    @property
    def ids(self) -> tuple[str, ...]:
        """Every KEK id held, the current first."""
        return tuple(self._by_id)

    def private_key(self, identifier: str) -> X25519PrivateKey | None:
        """The private KEK with this id, or None if this ring does not hold it."""
        return self._by_id.get(identifier)


class KekProvider(Protocol):
    """Where a process gets its KEKs (a file or the environment today, a KMS later)."""

    def public_key(self) -> KekPublicKey:
        """The current KEK's public half, for wrapping new data keys."""
        ...

    def ring(self) -> KekRing:
        """Every private KEK this process may unwrap with (readers only).

        Raises:
            KeyMaterialError: this provider holds no private key.
        """
        ...


def generate_private_key() -> X25519PrivateKey:
    """A new random X25519 key pair (its private half)."""
    return X25519PrivateKey.generate()


def public_key_text(key: X25519PublicKey) -> str:
    """``x25519:<base64url, no padding>`` of the 32 raw bytes: what agents are configured with."""
    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return PUBLIC_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def private_key_text(key: X25519PrivateKey) -> str:
    """``x25519-private:<base64url, no padding>`` of the 32 raw bytes: a keyring file's line."""
    raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return PRIVATE_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _raw(text: str, prefix: str, what: str) -> bytes:
    text = text.strip()
    if not text.startswith(prefix):
        raise KeyMaterialError(f"{what} must start with {prefix!r}")
    body = text[len(prefix):]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise KeyMaterialError(f"{what} is not base64url") from None
    if len(raw) != _KEY_BYTES:
        raise KeyMaterialError(f"{what} is {len(raw)} bytes; an X25519 key is {_KEY_BYTES}")
    return raw


def parse_public_key(text: str) -> KekPublicKey:
    """A public KEK from its text (:func:`public_key_text`), or a private one's public half.

    Raises:
        KeyMaterialError: not such a text.
    """
    if text.strip().startswith(PRIVATE_PREFIX):
        return KekPublicKey.of(_parse_private(text).public_key())
    return KekPublicKey.of(X25519PublicKey.from_public_bytes(_raw(text, PUBLIC_PREFIX, "a public KEK")))


def _parse_private(text: str) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(_raw(text, PRIVATE_PREFIX, "a private KEK"))


def kek_ring_from_text(text: str) -> KekRing:
    """A ring from keyring text: one ``x25519-private:`` key per line, newest first; blank
    lines and lines starting with ``#`` are skipped.

    Raises:
        KeyMaterialError: a line is not a private key, the text is over ``MAX_KEYRING_BYTES``,
            or it holds no key (the message names the line number, never its bytes).
    """
    if len(text.encode("utf-8")) > MAX_KEYRING_BYTES:
        raise KeyMaterialError(f"the keyring is over {MAX_KEYRING_BYTES} bytes")
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            keys.append(_parse_private(line))
        except KeyMaterialError as e:
            raise KeyMaterialError(f"keyring line {number}: {e}") from None
    return KekRing(keys)


def _check_private_file(path: Path) -> None:
    info = path.stat()
    if info.st_uid != os.getuid():
        raise KeyMaterialError(f"{path} belongs to another user; a keyring must be this user's")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise KeyMaterialError(f"{path} is readable by others (mode {stat.S_IMODE(info.st_mode):o}): chmod 600 it")


class FileKekProvider:
    """KEKs from a keyring file (:func:`kek_ring_from_text`'s format), read once.

    Raises:
        KeyMaterialError: (constructor) the file is missing, not this user's, readable by
            group or others, or not a keyring.
    """

    def __init__(self, path: Path) -> None:
        try:
            _check_private_file(path)
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise KeyMaterialError(f"no keyring at {path}: create one with `turnlog keys init`") from None
        except OSError as e:
            raise KeyMaterialError(f"cannot read the keyring {path}: {e.strerror}") from None
        try:
            self._ring = kek_ring_from_text(text)
        except KeyMaterialError as e:
            raise KeyMaterialError(f"{path}: {e}") from None

    def public_key(self) -> KekPublicKey:
        return self._ring.current

    def ring(self) -> KekRing:
        return self._ring


class TextKekProvider:
    """KEKs from keyring text given directly (:func:`kek_ring_from_text`'s format): an
    environment variable holding a secret (``TURNLOG_KEYRING``).

    Raises:
        KeyMaterialError: (constructor) the text is not a keyring.
    """

    def __init__(self, text: str, *, source: str = "TURNLOG_KEYRING") -> None:
        try:
            self._ring = kek_ring_from_text(text)
        except KeyMaterialError as e:
            raise KeyMaterialError(f"{source}: {e}") from None

    def public_key(self) -> KekPublicKey:
        return self._ring.current

    def ring(self) -> KekRing:
        return self._ring


def _write_private(path: Path, lines: Iterable[str]) -> None:
    """Write ``lines`` to ``path`` atomically, mode 0600 from its creation."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as f:
            f.write("".join(f"{line}\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def create_keyring_file(path: Path) -> KekPublicKey:
    """Create a keyring file holding one new KEK; return its public half.

    Raises:
        KeyMaterialError: the file exists already (rotate it instead).
    """
    if path.exists():
        raise KeyMaterialError(f"{path} exists: rotate it with `turnlog keys rotate`, or remove it first")
    key = generate_private_key()
    _write_private(path, ["# turnlog KEKs, newest first (turnlog keys rotate)", private_key_text(key)])
    return KekPublicKey.of(key.public_key())


def rotate_keyring_file(path: Path) -> KekPublicKey:
    """Put a new KEK first in an existing keyring file (the older ones stay, for reading);
    return the new public half, which agents must be given.

    Raises:
        KeyMaterialError: as :class:`FileKekProvider`.
    """
    old = FileKekProvider(path).ring()
    new = generate_private_key()
    texts = [private_key_text(new)]
    for identifier in old.ids:
        key = old.private_key(identifier)
        assert key is not None
        texts.append(private_key_text(key))
    _write_private(path, ["# turnlog KEKs, newest first (turnlog keys rotate)", *texts])
    return KekPublicKey.of(new.public_key())
