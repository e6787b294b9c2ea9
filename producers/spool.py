"""The recorder's durable local spool: one SQLite file (WAL mode) per recorder.

Every event the recorder records is committed here (``synchronous=FULL``: the
WAL is fsynced at each commit) before the recorder reports it spooled; the
drainer (``producers/drainer.py``) delivers the rows to Kafka in row order and
deletes a row once the broker has acknowledged it. A row therefore leaves the
spool only after the broker holds it (``acks=all``).

Why SQLite in WAL mode rather than an append-only file: a commit is one WAL
append plus one fsync, and several events queued together share it (group
commit); a torn write at the tail is rolled back on the next open, with no
framing or checksums of our own; acknowledged rows are deleted by key with no
compaction pass; and it is in the standard library.

Ownership: each live recorder holds an exclusive ``flock`` on its file's
``.lock`` companion. The kernel drops it when the process dies (SIGKILL
included), so a spool whose lock can be taken is an orphan: the next recorder
on the host adopts its rows (:meth:`SpoolFile.adopt_orphans`) and delivers
them. Deletes after acknowledgement run with ``synchronous=NORMAL``: losing one
to a power cut only re-sends an event, which the sequencer drops as a
duplicate by ``(session_id, seq)``.

Privacy: the spool holds transcript text, so its folder is mode 0700 and every
file in it (the database, its ``-wal`` and ``-shm`` files, the ``.lock``) 0600,
whatever the umask. A missing folder is created so; an existing one must belong
to the recorder's user (else :class:`SpoolError`) and is tightened to 0700 with
a warning if it was looser. The database file is created 0600 before SQLite
opens it, and SQLite gives its ``-wal`` and ``-shm`` files the database's mode.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import stat
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import msgspec

from turnlog.producers.exceptions import SpoolError

__all__ = ["SpoolFile", "SpoolRow", "SpooledEvent", "SPOOL_GLOB", "held_by_other_spools"]

logger = logging.getLogger(__name__)
SPOOL_GLOB = "spool-*.db"

_QUARANTINE = """
CREATE TABLE IF NOT EXISTS quarantined AS SELECT * FROM spooled WHERE 0
"""
_SCHEMA = """
CREATE TABLE IF NOT EXISTS spooled (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    key BLOB NOT NULL,
    value BLOB NOT NULL,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    spooled_at REAL NOT NULL,
    headers BLOB
)
"""
#: The columns of a row after its id, in the order every statement here names them.
_COLUMNS = "topic, key, value, session_id, seq, spooled_at, headers"


@dataclass(frozen=True, slots=True)
class SpooledEvent:
    """An event to spool: its Kafka topic, key and value (bytes), its session and seq, and the
    record headers it is produced with (the fleet signature, ``turnlog/signing.py``; kept with
    the event, so a recorder that adopts an orphaned spool delivers it signed as it was)."""

    topic: str
    key: bytes
    value: bytes
    session_id: str
    seq: int
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SpoolRow:
    """A spooled event with its row id (the delivery order) and when it was spooled (Unix seconds)."""

    id: int
    event: SpooledEvent
    spooled_at: float


class SpoolFile:
    """One recorder's spool file. Not thread-safe: one thread (the drainer's) uses it.

    Raises:
        SpoolError: the folder cannot be created or the file cannot be opened
            or written (a full disk, a read-only volume).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        _private_folder(folder)
        self.path = folder / f"spool-{os.getpid()}-{uuid.uuid4().hex[:12]}.db"
        lock_fd = _take_lock(self.path)
        if lock_fd is None:  # a fresh name: nobody can hold it
            raise SpoolError(f"cannot lock the new spool file {self.path}")
        self._lock_fd = lock_fd
        try:
            _create_private_file(self.path)
            self._db = _connect(self.path)
        except (OSError, sqlite3.Error) as e:
            os.close(lock_fd)
            raise SpoolError(f"cannot create the spool file {self.path}: {e}") from e

    # -- writing ------------------------------------------------------------
    def append(
        self, events: Iterable[SpooledEvent], *, delete_ids: Iterable[int] = (),
        spooled_at: Iterable[float] | None = None
    ) -> list[int]:
        """Commit ``events`` (in order) and fsync; also delete ``delete_ids`` in the same
        transaction. ``spooled_at``: each event's first spooling time (Unix seconds;
        default now). Returns the new rows' ids, in order."""
        events = list(events)
        times = list(spooled_at) if spooled_at is not None else [time.time()] * len(events)
        with self._errors("append to"):
            self._db.execute("PRAGMA synchronous=FULL")
            with self._db:
                self._delete(delete_ids)
                return [
                    cast(int, self._db.execute(  # an INSERT's cursor always has its row's id
                        f"INSERT INTO spooled ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                        (e.topic, e.key, e.value, e.session_id, e.seq, at, _encode_headers(e.headers)),
                    ).lastrowid)
                    for e, at in zip(events, times, strict=True)
                ]

    def quarantine(self, row_id: int) -> None:
        """Move one row out of the delivery order into the ``quarantined`` table (kept on disk)."""
        with self._errors("quarantine in"):
            self._db.execute("PRAGMA synchronous=FULL")
            with self._db:
                self._db.execute(
                    f"INSERT INTO quarantined (id, {_COLUMNS}) SELECT id, {_COLUMNS} FROM spooled WHERE id = ?",  # noqa: S608
                    (row_id,),
                )
                self._db.execute("DELETE FROM spooled WHERE id = ?", (row_id,))

    def delete(self, ids: Iterable[int]) -> None:
        """Delete acknowledged rows (no fsync: see the module docstring)."""
        with self._errors("delete from"):
            self._db.execute("PRAGMA synchronous=NORMAL")
            with self._db:
                self._delete(ids)

    def drop_sessions(self, session_ids: Collection[str]) -> tuple[list[tuple[int, str, int]], int]:
        """Delete every row of ``session_ids`` (forgotten sessions), from the delivery order and the
        ``quarantined`` table, in one fsynced transaction, with SQLite's ``secure_delete`` (the
        freed bytes are zeroed) and then a WAL checkpoint that truncates the ``-wal`` file, so the
        file no longer holds the rows' bytes (best effort: a reader of the file, such as another
        recorder's ``held_by_other_spools``, can make the checkpoint wait for the next one).

        Returns ``([(row id, session id, value bytes) of the delivery-order rows], quarantined rows)``.
        """
        ids = sorted(set(session_ids))
        if not ids:
            return [], 0
        marks = ", ".join("?" * len(ids))
        with self._errors("drop forgotten sessions from"):
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA secure_delete=ON")
            try:
                with self._db:
                    returning = "RETURNING id, session_id, length(value)"
                    dropped = [
                        (row_id, session_id, size) for row_id, session_id, size in self._db.execute(
                            f"DELETE FROM spooled WHERE session_id IN ({marks}) {returning}", ids  # noqa: S608
                        )
                    ]
                    quarantined = self._db.execute(
                        f"DELETE FROM quarantined WHERE session_id IN ({marks})", ids  # noqa: S608
                    ).rowcount
            finally:
                self._db.execute("PRAGMA secure_delete=OFF")
            busy = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        if busy:
            logger.info("spool %s: the WAL is read by another process; truncated at a later checkpoint", self.path)
        return sorted(dropped), max(0, quarantined)

    def _delete(self, ids: Iterable[int]) -> None:
        self._db.executemany("DELETE FROM spooled WHERE id = ?", ((i,) for i in ids))

    # -- reading ------------------------------------------------------------
    def rows_from(self, first_id: int, limit: int) -> list[SpoolRow]:
        """Up to ``limit`` rows with ``id >= first_id``, in id order."""
        with self._errors("read"):
            return list(_rows(self._db, "WHERE id >= ? ORDER BY id LIMIT ?", (first_id, limit)))

    def totals(self) -> tuple[int, int, dict[str, int]]:
        """``(events, bytes of values, events per session)`` held now."""
        with self._errors("read"):
            per_session = dict(self._db.execute("SELECT session_id, count(*) FROM spooled GROUP BY session_id"))
            size = self._db.execute("SELECT coalesce(sum(length(value)), 0) FROM spooled").fetchone()[0]
        return sum(per_session.values()), size, per_session

    def oldest_spooled_at(self) -> float | None:
        """When the oldest row still held was spooled (Unix seconds); None when empty."""
        with self._errors("read"):
            row = self._db.execute("SELECT spooled_at FROM spooled ORDER BY id LIMIT 1").fetchone()
        return None if row is None else row[0]

    # -- orphans ------------------------------------------------------------
    def adopt_orphans(self, on_adopted: Callable[[list[SpoolRow]], object]) -> int:
        """Move the rows of every orphaned spool in the folder into this one; returns how many.

        An orphan is a spool file whose lock nobody holds (its recorder died).
        Its rows are committed here, in their order and with their first
        spooling time, then ``on_adopted(rows as stored here)`` is called, then
        its file is deleted (the database first, the lock last). A crash in
        between leaves them in both places, which only re-sends them
        (duplicates by seq). An orphan that cannot be read is left in place.
        """
        adopted = 0
        for path in sorted(self.folder.glob(SPOOL_GLOB)):
            if path == self.path:
                continue
            lock_fd = _take_lock(path)
            if lock_fd is None:
                continue  # a live recorder's spool
            removed = False
            try:
                if not path.exists():
                    removed = True  # adopted by another recorder a moment ago
                    continue
                try:
                    _tighten_spool_files(path)  # one left by an older turnlog may be 0644
                    orphan = _connect(path)
                    try:
                        rows = list(_rows(orphan, "ORDER BY id", ()))
                        set_aside = orphan.execute(f"SELECT {_COLUMNS} FROM quarantined ORDER BY id").fetchall()  # noqa: S608
                    finally:
                        orphan.close()
                except sqlite3.Error as e:
                    logger.error("spool %s cannot be read (%s); left in place", path, e)
                    continue
                if set_aside:
                    with self._errors("keep the quarantined rows in"), self._db:
                        self._db.executemany(
                            f"INSERT INTO quarantined ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                            set_aside,
                        )
                ids = self.append([r.event for r in rows], spooled_at=[r.spooled_at for r in rows])
                on_adopted([SpoolRow(i, r.event, r.spooled_at) for i, r in zip(ids, rows, strict=True)])
                adopted += len(rows)
                for suffix in ("", "-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        Path(f"{path}{suffix}").unlink()
                removed = True
                if rows:
                    logger.warning("adopted %d undelivered events from the orphaned spool %s", len(rows), path)
            finally:
                if removed:
                    with contextlib.suppress(FileNotFoundError):
                        _lock_path(path).unlink()
                os.close(lock_fd)
        return adopted

    def close(self, *, remove_if_empty: bool) -> None:
        """Close the file and release its lock; with ``remove_if_empty``, delete it when it holds nothing."""
        empty = self.oldest_spooled_at() is None and not self._db.execute(
            "SELECT 1 FROM quarantined LIMIT 1"
        ).fetchone()
        self._db.close()
        if remove_if_empty and empty:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{self.path}{suffix}").unlink()
            with contextlib.suppress(FileNotFoundError):
                _lock_path(self.path).unlink()
        os.close(self._lock_fd)

    @contextlib.contextmanager
    def _errors(self, verb: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise SpoolError(f"cannot {verb} the spool {self.path}: {e}") from e


def held_by_other_spools(folder: Path, session_id: str, *, own: Path | None) -> dict[Path, int]:
    """Events of ``session_id`` still to be delivered from the spools in ``folder`` other than
    ``own``: ``{spool path: events}``, only spools that hold some.

    Another live recorder on the host may have adopted a dead recorder's spool
    and still be delivering it (the broker was away): until it has, a resume of
    the session must not claim a new epoch (``SessionRecorder.resume``). Each
    file is opened read-only; a file removed meanwhile (adopted, or closed
    empty) holds nothing. Quarantined rows are never delivered, so they do not
    count. A file that cannot be read is logged and skipped: waiting cannot
    deliver it either (``turnlog spool-drain`` reports it).
    """
    held: dict[Path, int] = {}
    for path in sorted(folder.glob(SPOOL_GLOB)):
        if path == own:
            continue
        try:
            db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
            try:
                count = 0
                if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'spooled'").fetchone():
                    count = db.execute("SELECT count(*) FROM spooled WHERE session_id = ?", (session_id,)).fetchone()[0]
            finally:
                db.close()
        except sqlite3.Error as e:
            if path.exists():
                logger.warning("spool %s cannot be read (%s); not waiting for it", path, e)
            continue
        if count:
            held[path] = count
    return held


def _private_folder(folder: Path) -> None:
    """Create ``folder`` (and its parents) with mode 0700, or make sure an existing one is
    this process's user's and mode 0700.

    Raises:
        SpoolError: it cannot be created or read, is not a folder, or belongs to
            another user (who could read the spooled transcripts).
    """
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # the mode of the last part only
        info = folder.stat()
    except OSError as e:
        raise SpoolError(f"cannot create the spool folder {folder}: {e}") from e
    if info.st_uid != os.geteuid():
        raise SpoolError(
            f"the spool folder {folder} belongs to uid {info.st_uid}, not to this process's uid {os.geteuid()}, "
            "and its owner could read the spooled transcripts: run as its owner (`turnlog spool-drain` too), or "
            "set TURNLOG_SPOOL_DIR to a folder of this user (a missing one is created, mode 0700)"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode != 0o700:
        try:
            os.chmod(folder, 0o700)
        except OSError as e:
            raise SpoolError(f"cannot make the spool folder {folder} private (mode 0700): {e}") from e
        if mode & 0o077:
            logger.warning("the spool folder %s was mode %03o, open to other users; made it 0700", folder, mode)


def _create_private_file(path: Path) -> None:
    """Create the empty file ``path`` with mode 0600 (exactly, whatever the umask); fails if it exists."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a umask such as 0o277 would have left less
    finally:
        os.close(fd)


def _tighten_spool_files(path: Path) -> None:
    """Mode 0600 for the database ``path`` and its ``-wal`` and ``-shm`` files, those that exist
    and are ours (SQLite gives new ``-wal``/``-shm`` files the database's mode)."""
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.chmod(f"{path}{suffix}", 0o600, follow_symlinks=False)


def _lock_path(path: Path) -> Path:
    return path.with_suffix(".lock")


def _take_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path``'s lock file, or None if someone holds it."""
    fd = os.open(_lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _connect(path: Path) -> sqlite3.Connection:
    """Open the existing spool database ``path`` (``mode=rw``: SQLite never creates it, so it
    keeps the 0600 it was created with). ``Path.as_uri`` percent-encodes the path, so a ``#``,
    ``?``, ``%``, space or non-ASCII character in it names that file, not a URI part."""
    # The default isolation level: a write opens a transaction, and `with db:` commits it.
    db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=rw", uri=True, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(_SCHEMA)
    db.execute(_QUARANTINE)
    for table in ("spooled", "quarantined"):  # a spool written before rows had headers
        if "headers" not in {column[1] for column in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN headers BLOB")
    return db


def _encode_headers(headers: tuple[tuple[str, bytes], ...]) -> bytes | None:
    return msgspec.msgpack.encode(headers) if headers else None


def _decode_headers(blob: bytes | None) -> tuple[tuple[str, bytes], ...]:
    return msgspec.msgpack.decode(blob, type=tuple[tuple[str, bytes], ...]) if blob else ()


def _rows(db: sqlite3.Connection, where: str, params: tuple[object, ...]) -> Iterator[SpoolRow]:
    query = f"SELECT id, {_COLUMNS} FROM spooled {where}"  # noqa: S608
    for row_id, topic, key, value, session_id, seq, spooled_at, headers in db.execute(query, params):
        event = SpooledEvent(topic, bytes(key), bytes(value), session_id, seq, _decode_headers(headers))
        yield SpoolRow(row_id, event, spooled_at)
