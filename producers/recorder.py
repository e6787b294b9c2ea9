"""SessionRecorder: write every turn ahead to Kafka as it happens.

Usage (asyncio)::

    async with SessionRecorder(settings) as recorder:
        session = await recorder.start_session("call-42", fleet="support", agent_id="bot-7")
        session.update_partial(0, "user", "I'd like to")           # no I/O; the timer flushes
        await session.complete_turn(0, "user", "I'd like to cancel")  # returns once acknowledged
        await session.end("hangup")

Guarantees (DESIGN.md): ``complete_turn`` returns only after the broker has
acknowledged the event (``acks=all``, idempotent producer); the timer (every
``flush_interval_seconds``, default 5 s) sends the in-progress partial, so a
SIGKILL loses at most one timer interval of an unfinished turn. ``seq`` is
assigned here, strictly increasing from 0; ``epoch`` grows by one on each
:meth:`SessionRecorder.resume`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import signal
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from confluent_kafka import Message

from turnlog.producers.exceptions import (
    DeliveryError,
    InvalidTurnError,
    RecorderError,
    SessionClosedError,
    SessionNotFoundError,
)
from turnlog.producers.kafka import AsyncProducer, idempotent_config
from turnlog.producers.resume import ResumeBarrier
from turnlog.schemas.events import EARLIEST_YEAR, LATEST_YEAR
from turnlog.schemas import (
    Event,
    EventValidationError,
    SessionEnded,
    SessionStarted,
    ToolCall,
    TurnCompleted,
    TurnPartial,
    decode_event,
    encode_event,
)
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore, open_store

__all__ = ["SessionRecorder", "RecordedSession"]

logger = logging.getLogger(__name__)
MAX_NAME_CHARS = 200
MAX_TURN_INDEX = 2**31 - 1  # the schema's (and the store's integer column's) bound


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class RecordedSession:
    """One session being recorded by this process. Create it with
    :meth:`SessionRecorder.start_session` or :meth:`SessionRecorder.resume`.

    At most one turn is open (has partial text) at a time.
    """

    def __init__(self, recorder: SessionRecorder, session_id: str, *, epoch: int, next_seq: int, next_turn_index: int) -> None:
        self._recorder = recorder
        self.session_id = session_id
        self.epoch = epoch
        self._next_seq = next_seq
        self._next_turn_index = next_turn_index
        self._open: dict[str, Any] | None = None  # the in-progress partial
        self._open_dirty = False
        self._pending: set[asyncio.Future[Message]] = set()
        self.closed = False
        #: The first DeliveryError of this session, if any: its seqs now have a gap.
        self.failed: DeliveryError | None = None

    @property
    def next_seq(self) -> int:
        """The seq the next event will carry."""
        return self._next_seq

    @property
    def next_turn_index(self) -> int:
        """The lowest turn index a new turn may use."""
        return self._next_turn_index

    # -- turns ---------------------------------------------------------------
    def update_partial(self, turn_index: int, speaker: str, text: str, *, started_at: dt.datetime | None = None) -> None:
        """Record the whole text of the open turn so far (not a delta). No I/O:
        the recorder's timer sends the newest text every flush interval.

        Raises:
            InvalidTurnError: bad types or values, text over ``max_text_bytes``,
                a turn index below :attr:`next_turn_index`, or another turn open.
            SessionClosedError: the session has ended.
        """
        self._check_open()
        self._check_turn(turn_index, speaker, text)
        if self._open is not None and self._open["turn_index"] != turn_index:
            raise InvalidTurnError(
                f"turn {self._open['turn_index']} of {self.session_id} is still open; complete it before turn {turn_index}"
            )
        if self._open is None:
            self._open = {
                "turn_index": turn_index,
                "speaker": speaker,
                "started_at": _checked_time(started_at, "started_at") if started_at else _utcnow(),
            }
        elif speaker != self._open["speaker"]:
            raise InvalidTurnError(f"turn {turn_index} is spoken by {self._open['speaker']!r}, not {speaker!r}")
        if self._open.get("text") != text:
            self._open["text"] = text
            self._open_dirty = True

    async def complete_turn(
        self,
        turn_index: int,
        speaker: str,
        text: str,
        *,
        started_at: dt.datetime | None = None,
        ended_at: dt.datetime | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        tool_calls: Iterable[ToolCall | Mapping[str, Any]] | None = None,
    ) -> None:
        """Send the finished turn and return once the broker acknowledged it.

        ``started_at`` defaults to the open partial's start (or now); token
        counts are integers >= 0.

        Raises:
            InvalidTurnError, SessionClosedError: as :meth:`update_partial`; nothing is sent.
            DeliveryError: not acknowledged within the delivery timeout.
        """
        self._check_open()
        self._check_turn(turn_index, speaker, text)
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if not _is_int(value) or value < 0:
                raise InvalidTurnError(f"{name} must be an int >= 0, got {value!r}")
        if self._open is not None and self._open["turn_index"] != turn_index:
            raise InvalidTurnError(f"turn {self._open['turn_index']} is open; cannot complete turn {turn_index}")
        if started_at is None:
            started_at = self._open["started_at"] if self._open is not None else _utcnow()
        started_at = _checked_time(started_at, "started_at")
        ended_at = _checked_time(ended_at, "ended_at") if ended_at is not None else max(_utcnow(), started_at)
        if ended_at < started_at:
            raise InvalidTurnError("ended_at is before started_at")
        calls = None if tool_calls is None else [_tool_call(c) for c in tool_calls]
        future = self._emit(
            TurnCompleted,
            turn_index=turn_index,
            speaker=speaker,
            text=text,
            started_at=started_at,
            ended_at=ended_at,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            tool_calls=calls,
        )
        self._open, self._open_dirty = None, False
        self._next_turn_index = turn_index + 1
        try:
            await future
        except DeliveryError as e:
            self._mark_failed(e)
            raise

    async def flush_partial(self) -> None:
        """Send the open turn's newest text now, if it changed, and wait for the ack."""
        future = self._emit_partial()
        if future is not None:
            await future

    async def end(self, reason: str = "completed", *, ended_at: dt.datetime | None = None) -> None:
        """Send ``session.ended`` (after the open partial, which is then kept as
        interrupted) and wait until every event of the session is acknowledged."""
        self._check_open()
        _check_name("reason", reason)
        self._emit_partial()
        last = self._next_turn_index - 1 if self._open is None else self._open["turn_index"]
        self._emit(
            SessionEnded,
            ended_at=_checked_time(ended_at, "ended_at") if ended_at else _utcnow(),
            reason=reason,
            last_turn_index=last if last >= 0 else None,
        )
        self.closed = True
        self._recorder._forget(self)
        await self.wait_acknowledged()

    async def wait_acknowledged(self) -> None:
        """Wait until every event sent so far is acknowledged (raises the first DeliveryError)."""
        if self._pending:
            await asyncio.gather(*list(self._pending))

    # -- internals -----------------------------------------------------------
    def _emit_partial(self) -> asyncio.Future[Message] | None:
        if self._open is None or not self._open_dirty or "text" not in self._open:
            return None
        self._open_dirty = False
        return self._emit(
            TurnPartial,
            turn_index=self._open["turn_index"],
            speaker=self._open["speaker"],
            text=self._open["text"],
            started_at=self._open["started_at"],
        )

    def _emit(self, event_type: type[Event], **fields: Any) -> asyncio.Future[Message]:
        event = event_type(
            event_id=uuid.uuid4(),
            session_id=self.session_id,
            seq=self._next_seq,
            epoch=self.epoch,
            producer_id=self._recorder.producer_id,
            emitted_at=_utcnow(),
            **fields,
        )
        try:
            payload = encode_event(event)
            decode_event(payload)  # the struct constructor does not check ranges; the schema does
        except EventValidationError as e:
            raise InvalidTurnError(f"{event_type.__struct_config__.tag}: {e.reason}") from e
        except (TypeError, msgspec.EncodeError) as e:
            raise InvalidTurnError(f"{event_type.__struct_config__.tag}: cannot encode: {e}") from e
        future = self._recorder._send(self.session_id, payload)
        self._next_seq += 1
        self._pending.add(future)
        future.add_done_callback(self._on_delivery)
        return future

    def _on_delivery(self, future: asyncio.Future[Message]) -> None:
        self._pending.discard(future)
        if future.cancelled():
            return
        error = future.exception()
        if isinstance(error, DeliveryError):
            self._mark_failed(error)

    def _mark_failed(self, error: DeliveryError) -> None:
        # A lost seq is a gap the sequencer will wait on: nothing more may be
        # sent in this epoch. resume() continues from what the store holds.
        if self.failed is not None:
            return
        self.failed = error
        self._recorder._forget(self)
        logger.error("session %s: event not delivered (%s); resume() it to continue", self.session_id, error)

    def _check_open(self) -> None:
        if self.closed:
            raise SessionClosedError(f"session {self.session_id} has ended; no more events can be recorded")
        if self.failed is not None:
            raise SessionClosedError(
                f"session {self.session_id}: an event was not delivered ({self.failed}); "
                "resume() the session to continue in a new epoch"
            )

    def _check_turn(self, turn_index: int, speaker: str, text: str) -> None:
        if not _is_int(turn_index) or not 0 <= turn_index <= MAX_TURN_INDEX:
            raise InvalidTurnError(f"turn_index must be an int from 0 to {MAX_TURN_INDEX}, got {turn_index!r}")
        if turn_index < self._next_turn_index:
            raise InvalidTurnError(
                f"turn {turn_index} of {self.session_id} is already recorded; the next turn is {self._next_turn_index}"
            )
        _check_name("speaker", speaker)
        if not isinstance(text, str):
            raise InvalidTurnError(f"text must be a str, got {type(text).__name__}")
        size = _utf8_size("text", text)
        limit = self._recorder.settings.max_text_bytes
        if size > limit:
            raise InvalidTurnError(f"text is {size} bytes; the limit is {limit} bytes (TURNLOG_MAX_TEXT_BYTES)")


class SessionRecorder:
    """Records sessions through one idempotent Kafka producer.

    No network I/O happens in the constructor; :meth:`start` (or ``async with``)
    creates the producer and the flush timer. ``store`` is needed only by
    :meth:`resume` (defaults to ``settings.database_url``).
    """

    def __init__(
        self,
        settings: TurnlogSettings | None = None,
        *,
        producer_id: str | None = None,
        producer_config: Mapping[str, Any] | None = None,
        store: SqlStore | None = None,
    ) -> None:
        self.settings = settings or TurnlogSettings()
        self.producer_id = producer_id or f"recorder-{uuid.uuid4()}"
        config = idempotent_config(
            self.settings.bootstrap_servers,
            client_id=self.producer_id,
            delivery_timeout_seconds=self.settings.delivery_timeout_seconds,
        )
        self._producer = AsyncProducer({**config, **(producer_config or {})})
        self._store = store
        self._sessions: dict[str, RecordedSession] = {}
        self._timer: asyncio.Task[None] | None = None
        self.terminating = asyncio.Event()

    async def start(self) -> SessionRecorder:
        self._producer.start()
        if self._timer is None:
            self._timer = asyncio.create_task(self._flush_partials_forever(), name="turnlog-partial-timer")
        return self

    async def __aenter__(self) -> SessionRecorder:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start_session(
        self,
        session_id: str,
        *,
        fleet: str,
        agent_id: str,
        metadata: Mapping[str, Any] | None = None,
        started_at: dt.datetime | None = None,
    ) -> RecordedSession:
        """Open a new session (epoch 0, seq 0) and wait until ``session.started`` is acknowledged.

        Raises:
            InvalidTurnError: a bad id, fleet, agent id or metadata (not JSON-able).
            SessionClosedError: this recorder already records ``session_id``.
        """
        if session_id in self._sessions:
            raise SessionClosedError(f"session {session_id} is already being recorded here")
        _check_name("fleet", fleet)
        _check_name("agent_id", agent_id)
        session = RecordedSession(self, session_id, epoch=0, next_seq=0, next_turn_index=0)
        future = session._emit(
            SessionStarted,
            fleet=fleet,
            agent_id=agent_id,
            started_at=_checked_time(started_at, "started_at") if started_at else _utcnow(),
            metadata=dict(metadata or {}),
        )
        self._sessions[session_id] = session
        await future
        return session

    async def resume(self, session_id: str, *, timeout: float | None = None) -> RecordedSession:
        """Continue a session another process was recording, in a new epoch.

        Waits at the resume barrier (see ``producers/resume.py``) until the
        pipeline has applied everything the predecessor got acknowledged, then
        continues after the stored ``last_seq`` and the highest stored turn.
        The predecessor's unfinished turn stays as it is (marked interrupted
        once this epoch's first event is applied); new turns start after it.

        Raises:
            ResumeBarrierTimeout: the pipeline did not catch up within ``timeout``
                seconds (default ``settings.resume_timeout_seconds``).
            SessionNotFoundError: the store has no such session.
            SessionClosedError: the session has ended.
        """
        if session_id in self._sessions:
            raise SessionClosedError(f"session {session_id} is being recorded by this recorder already")
        if self._store is None:
            self._store = open_store(self.settings.database_url)
        barrier = ResumeBarrier(self.settings, self._store)
        wait = timeout if timeout is not None else self.settings.resume_timeout_seconds
        claimed = await asyncio.to_thread(barrier.wait, session_id, wait)
        if claimed is None:
            raise SessionNotFoundError(f"no session {session_id} in the store")
        epoch, position = claimed
        if position.status != "active":
            raise SessionClosedError(f"session {session_id} is {position.status}; it cannot be resumed")
        next_turn = 0 if position.max_turn_index is None else position.max_turn_index + 1
        session = RecordedSession(
            self, session_id, epoch=epoch, next_seq=position.last_seq + 1, next_turn_index=next_turn
        )
        self._sessions[session_id] = session
        logger.info(
            "resumed %s at epoch %d, seq %d, turn %d", session_id, session.epoch, session.next_seq, next_turn
        )
        return session

    async def drain(self) -> None:
        """Send every open partial and wait for all acknowledgements (SIGTERM path).

        Correctness never depends on this: it only shortens what a planned stop loses.
        """
        for session in list(self._sessions.values()):
            session._emit_partial()
        await asyncio.gather(*(s.wait_acknowledged() for s in list(self._sessions.values())), return_exceptions=True)

    def install_sigterm_drain(self) -> None:
        """On SIGTERM: drain, then set :attr:`terminating` (the agent decides how to exit)."""
        loop = asyncio.get_running_loop()

        def on_sigterm() -> None:
            logger.info("SIGTERM: draining %d open sessions", len(self._sessions))
            task = loop.create_task(self.drain())
            task.add_done_callback(lambda _: self.terminating.set())

        loop.add_signal_handler(signal.SIGTERM, on_sigterm)

    async def close(self) -> None:
        """Stop the timer, drain, and flush the producer."""
        if self._timer is not None:
            self._timer.cancel()
            try:
                await self._timer
            except asyncio.CancelledError:
                pass
            except Exception:  # the timer must not keep close() from draining
                logger.exception("the partial timer had failed")
            self._timer = None
        await self.drain()
        await self._producer.close()

    # -- internals -----------------------------------------------------------
    def _send(self, session_id: str, payload: bytes) -> asyncio.Future[Message]:
        return self._producer.send(self.settings.topics.events, key=session_id.encode("utf-8"), value=payload)

    def _forget(self, session: RecordedSession) -> None:
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]

    async def _flush_partials_forever(self) -> None:
        interval = self.settings.flush_interval_seconds
        while True:
            await asyncio.sleep(interval)
            for session in list(self._sessions.values()):
                try:
                    session._emit_partial()  # a failed delivery marks the session failed
                except RecorderError as e:  # one session's problem must not stop the others' flushes
                    logger.error("session %s: partial not flushed: %s", session.session_id, e)


def _utf8_size(name: str, value: str) -> int:
    """Bytes of ``value`` in UTF-8; NUL and lone surrogates are refused (the store cannot hold them)."""
    if "\x00" in value:
        raise InvalidTurnError(f"{name} contains a NUL character")
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidTurnError(f"{name} is not valid Unicode text: {e.reason} at {e.start}") from e


def _check_name(name: str, value: object) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise InvalidTurnError(f"{name} must be a non-empty str of at most {MAX_NAME_CHARS} chars, got {value!r}")
    _utf8_size(name, value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_time(value: object, name: str) -> dt.datetime:
    if not isinstance(value, dt.datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTurnError(f"{name} must be a timezone-aware datetime, got {value!r}")
    if not EARLIEST_YEAR <= value.year <= LATEST_YEAR:
        raise InvalidTurnError(f"{name} must fall in the years {EARLIEST_YEAR}..{LATEST_YEAR}, got {value!r}")
    return value.astimezone(dt.timezone.utc)


def _tool_call(call: ToolCall | Mapping[str, Any]) -> ToolCall:
    if isinstance(call, ToolCall):
        return call
    if not isinstance(call, Mapping) or "name" not in call:
        raise InvalidTurnError(f"a tool call must be a ToolCall or a mapping with 'name', got {call!r}")
    arguments = call.get("arguments", {})
    if not isinstance(arguments, Mapping):
        raise InvalidTurnError(f"a tool call's arguments must be a mapping, got {type(arguments).__name__}")
    return ToolCall(name=call["name"], arguments=dict(arguments), result=call.get("result"))
