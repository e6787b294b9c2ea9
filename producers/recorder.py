"""SessionRecorder: write every turn ahead, through a durable local spool, to Kafka.

Usage (asyncio)::

    async with SessionRecorder(settings) as recorder:
        session = await recorder.start_session("call-42", fleet="support", agent_id="bot-7")
        session.update_partial(0, "user", "I'd like to")           # no I/O; the timer flushes
        session.update_partial(1, "agent", "Sure, let me")          # several turns may be open
        await session.complete_turn(1, "agent", "Sure, let me check", barged_in=True)
        await session.complete_turn(0, "user", "I'd like to cancel")
        await session.end("hangup")

Guarantees (docs/design.md, "The recorder"): every event is fsynced in the spool
(``producers/spool.py``) before ``complete_turn`` returns, and ``complete_turn``
returns once the broker has acknowledged it (``acks=all``, idempotent
producer) or, if the broker does not answer within ``ack_wait_seconds``, on the
spool alone: the recorder then runs degraded (a log line and the
``turnlog_recorder_degraded`` gauge) and later turns wait for nothing but the
fsync until the spool has drained. The drainer (``producers/drainer.py``)
never gives an event up. The timer (every ``flush_interval_seconds``, default
5 s) spools each open turn's newest partial, so a SIGKILL loses at most one
timer interval of an unfinished turn. ``seq`` is assigned here, strictly
increasing from 0; ``epoch`` grows by one on each :meth:`SessionRecorder.resume`.

Encryption (``turnlog.crypto``; docs/design.md, "Encryption and erasure"):
with a KEK (``TURNLOG_KEK_PUBLIC_KEY``, or the public half of
``TURNLOG_KEYRING_FILE``; ``TURNLOG_ENCRYPTION``), each session epoch this
recorder writes gets a fresh data key, and every event's content (turn text,
tool calls, metadata) is sealed before it reaches the spool: the spool, the
broker and every topic hold only ciphertext of what was said. The event is
checked in clear first, so the recorder refuses exactly what it did unsealed.

Erasure (docs/design.md, "Encryption and erasure"): the recorder follows the
erasure ledger ``<prefix>.erasures`` (``producers/erasure_watch.py``). Once it
reads the record of a session it records, or whose events its spool holds, the
spool drops that session's undelivered events and every further write to it
raises :class:`~turnlog.producers.exceptions.SessionErasedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import signal
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from turnlog import kafka, metrics
from turnlog.crypto.config import recorder_kek
from turnlog.crypto.envelope import EpochSealer
from turnlog.crypto.keys import KekPublicKey
from turnlog.exceptions import ConfigurationError
from turnlog.producers.api_client import ApiResumeSource
from turnlog.producers.drainer import SpoolDrainer, Ticket
from turnlog.producers.erasure_watch import ErasureWatch
from turnlog.producers.exceptions import (
    InvalidTurnError,
    RecorderError,
    ResumeBarrierTimeout,
    SessionClosedError,
    SessionErasedError,
    SessionNotFoundError,
)
from turnlog.producers.grant import ResumeSource, StoredTurn
from turnlog.producers.pii import Redactor, partial_redaction, redact_values, redactor_from_settings
from turnlog.producers.spool import SpooledEvent
from turnlog.schemas import (
    Event,
    EventValidationError,
    SessionEnded,
    SessionStarted,
    ToolCall,
    TurnCompleted,
    TurnKind,
    TurnPartial,
    decode_event,
    encode_event,
)
from turnlog.schemas.erasure import Erasure
from turnlog.schemas.events import EARLIEST_YEAR, LATEST_YEAR
from turnlog.schemas.session_keys import SessionKeyError, bare_id, grants_as, session_key
from turnlog.settings import TurnlogSettings
from turnlog.signing import RecordSigner, claim_headers
from turnlog.tracing import (
    NO_TRACING,
    TraceContext,
    TraceSpan,
    Tracing,
    ended_on_failure,
    producer_attributes,
    service_tracing,
)

__all__ = ["SessionRecorder", "RecordedSession"]

logger = logging.getLogger(__name__)
MAX_NAME_CHARS = 200
#: Longest number or time an error message shows as it is (characters of its repr).
MAX_SHOWN_CHARS = 80
MAX_TURN_INDEX = 2**31 - 1  # the schema's (and the store's integer column's) bound
#: Largest encoded event (bytes): under the producer's and the broker's default record
#: limit (1,000,000 bytes), so no spooled event can be refused by Kafka for its size.
MAX_EVENT_BYTES = 900_000
#: Framework attributes on one span, at most (a turn's and the session's together), and their bytes
#: (keys and values, UTF-8); a key is at most MAX_TRACE_KEY_CHARS, a str value MAX_TRACE_VALUE_BYTES.
MAX_TRACE_ATTRIBUTES = 16
MAX_TRACE_ATTRIBUTES_BYTES = 2048
MAX_TRACE_KEY_CHARS = 64
MAX_TRACE_VALUE_BYTES = 256
#: Attribute names turnlog sets itself: a framework's attribute may not start with these.
RESERVED_TRACE_PREFIXES = ("turnlog.", "messaging.")
TraceAttributes = Mapping[str, str | int | bool]
_SPOOL_POLL_SECONDS = 0.05
_OTHER_SPOOLS_POLL_SECONDS = 0.25  # each poll opens every spool file of the folder


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(slots=True)
class _OpenTurn:
    """A turn with partial text: who speaks, since when, the newest text, whether the timer must send it,
    and the (redacted) text last spooled."""

    speaker: str
    started_at: dt.datetime
    text: str | None = None
    dirty: bool = False
    sent: str | None = None


class RecordedSession:
    """One session being recorded by this process. Create it with
    :meth:`SessionRecorder.start_session` or :meth:`SessionRecorder.resume`.

    Any number of turns may be open (have partial text) at once, and they may
    be completed in any order: overlapping speech and barge-in. A turn index
    is used once: a completed turn cannot be reopened.

    ``turns`` holds, after :meth:`SessionRecorder.resume`, the turns the store
    held when the resume was granted (``turn_index`` order; text, speaker,
    status, tokens, tool calls): the conversation to rebuild an LLM context
    from. A predecessor's unfinished turn is there with status ``partial``.
    """

    def __init__(
        self,
        recorder: SessionRecorder,
        session_id: str,
        *,
        fleet: str | None,
        epoch: int,
        next_seq: int,
        next_turn_index: int,
        turns: tuple[StoredTurn, ...] = (),
        epoch_grant: str | None = None,
        kek: KekPublicKey | None = None,
    ) -> None:
        self._recorder = recorder
        #: the session's key, ``"<fleet>:<id>"`` (a session started before per-fleet keys: its bare
        #: id): what the store, the API, ``resume`` and ``turnlog forget`` name it by
        self.session_id = session_id
        #: the session's fleet: its events are signed with this fleet's key (None: unknown, unsigned)
        self.fleet = fleet
        self.epoch = epoch
        self._epoch_grant = epoch_grant
        self.turns = turns
        self._next_seq = next_seq
        #: turn indexes below this belong to a predecessor (resume): never reused
        self._first_turn_index = next_turn_index
        self._next_turn_index = next_turn_index
        self._open: dict[int, _OpenTurn] = {}
        self._completed: set[int] = set()
        self.closed = False
        #: True once the erasure ledger named this session: every write raises SessionErasedError
        self.erased = False
        #: this epoch's data key (None: content is written in clear)
        self._sealer = EpochSealer(kek, session_id, epoch) if kek is not None else None
        #: the framework's ids put on every span of this session (set_trace_attributes; never sent to Kafka)
        self._trace_attributes: dict[str, str | int | bool] = {}

    @property
    def next_seq(self) -> int:
        """The seq the next event will carry."""
        return self._next_seq

    @property
    def next_turn_index(self) -> int:
        """One past the highest turn index used so far (or stored, after a resume): a fresh index."""
        return self._next_turn_index

    @property
    def open_turns(self) -> tuple[int, ...]:
        """Indexes of the turns open now (with partial text), ascending."""
        return tuple(sorted(self._open))

    @property
    def trace_attributes(self) -> Mapping[str, str | int | bool]:
        """The session-wide span attributes set by :meth:`set_trace_attributes` (a read-only view)."""
        return dict(self._trace_attributes)

    def set_trace_attributes(self, attributes: TraceAttributes) -> None:
        """Put ``attributes`` (e.g. Pipecat's ``conversation.id``) on every span this session's later
        turns and its end make, merged over those set before (a key set again is replaced). Span-only:
        never written to the spool or Kafka, so a framework id may be anything the trace backend may see.

        Bounds (with a turn's own ``trace_attributes``, per span): at most ``MAX_TRACE_ATTRIBUTES``
        attributes and ``MAX_TRACE_ATTRIBUTES_BYTES`` of keys and values; a key a non-empty str of at
        most ``MAX_TRACE_KEY_CHARS`` printable ASCII characters, not starting with ``turnlog.`` or
        ``messaging.`` (turnlog's own); a value a str (at most ``MAX_TRACE_VALUE_BYTES`` UTF-8 bytes),
        an int (64-bit) or a bool. Checked whether tracing is on or not.

        Raises:
            InvalidTurnError: a key or value breaks the rules above; nothing is changed.
        """
        self._trace_attributes = _trace_attributes({**self._trace_attributes, **_trace_attributes(attributes)})

    # -- turns ---------------------------------------------------------------
    def update_partial(
        self, turn_index: int, speaker: str, text: str, *, started_at: dt.datetime | None = None
    ) -> None:
        """Record the whole text of an open turn so far (not a delta). No I/O:
        the recorder's timer spools the newest text of every open turn each
        flush interval. Opens the turn if it is not open yet; other turns may
        be open at the same time.

        Raises:
            InvalidTurnError: bad types or values, text over ``max_text_bytes``,
                a turn index already completed (or a predecessor's), or another
                speaker than the one who opened the turn.
            SessionClosedError: the session has ended.
        """
        self._check_open()
        self._check_turn(turn_index, speaker, text)
        turn = self._open.get(turn_index)
        if turn is None:
            start = _checked_time(started_at, "started_at") if started_at else _utcnow()
            turn = self._open[turn_index] = _OpenTurn(speaker, start)
            self._next_turn_index = max(self._next_turn_index, turn_index + 1)
        elif speaker != turn.speaker:
            raise InvalidTurnError(f"turn {turn_index} is spoken by {turn.speaker!r}, not {speaker!r}")
        if turn.text != text:
            turn.text = text
            turn.dirty = True

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
        barged_in: bool = False,
        trace_attributes: TraceAttributes | None = None,
        kind: TurnKind | str | None = None,
        in_context: bool = True,
    ) -> None:
        """Record the finished turn: return once the broker acknowledged it, or
        once it is fsynced in the spool if the broker does not answer within
        ``ack_wait_seconds`` (the recorder then runs degraded; see the module
        docstring).

        ``text`` is what was actually said. ``barged_in=True``: the other
        speaker cut the turn short, and ``text`` holds the words spoken before
        that (stored as a completed turn flagged ``barged_in``, unlike a turn
        left ``interrupted`` by a crash). ``started_at`` defaults to the open
        partial's start (or now); token counts are integers >= 0.

        ``kind``: what the turn was, where the framework tells it apart
        (:class:`~turnlog.schemas.TurnKind` or its value: ``"typed"``, ``"summary"``,
        ``"injected"``, ``"blocked"``). None or ``"spoken"`` (the default) writes no
        kind; any other makes the event schema version 4. Kept in clear, in the
        stored turn's ``attributes`` (``StoredTurn.kind`` after a resume).

        ``in_context=False``: the turn was said (it is part of the transcript) but the
        framework kept it out of the LLM's context (e.g. LiveKit's
        ``say(..., add_to_chat_ctx=False)``), so a context rebuilt from the stored turns
        leaves it out. Written as ``out_of_context: true`` (schema version 4) in clear, in the
        stored turn's ``attributes`` (``StoredTurn.in_context`` after a resume); True (the
        default) writes nothing.

        ``trace_attributes``: the framework's own ids for this turn (e.g. LiveKit's
        ``speech_id``), put on the turn's span only, with the session's
        (:meth:`set_trace_attributes`; the same bounds, counted together): never
        written to the spool or Kafka. With tracing off they are checked and dropped.

        Raises:
            InvalidTurnError, SessionClosedError: as :meth:`update_partial`, or a tool call's
                ``arguments``/``result`` nested deeper than ``MAX_VALUE_DEPTH`` or over
                ``MAX_TOOL_VALUE_BYTES`` encoded (``turnlog.schemas.events``); nothing is recorded.
            SpoolFullError: the spool is at ``spool_max_bytes``; nothing is recorded.
            SpoolError: the spool cannot be written (the turn may be retried).
        """
        self._check_open()
        self._check_turn(turn_index, speaker, text)
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if not _is_int(value) or value < 0:
                raise InvalidTurnError(f"{name} must be an int >= 0, got {_shown(value)}")
        if not isinstance(barged_in, bool):
            raise InvalidTurnError(f"barged_in must be a bool, got {_shown(barged_in)}")
        written_kind = _written_kind(kind)
        if not isinstance(in_context, bool):
            raise InvalidTurnError(f"in_context must be a bool, got {_shown(in_context)}")
        span_attributes = self._trace_attributes
        if trace_attributes is not None:
            span_attributes = _trace_attributes({**self._trace_attributes, **_trace_attributes(trace_attributes)})
        open_turn = self._open.get(turn_index)
        if open_turn is not None and speaker != open_turn.speaker:
            raise InvalidTurnError(f"turn {turn_index} is spoken by {open_turn.speaker!r}, not {speaker!r}")
        if started_at is None:
            started_at = open_turn.started_at if open_turn is not None else _utcnow()
        started_at = _checked_time(started_at, "started_at")
        ended_at = _checked_time(ended_at, "ended_at") if ended_at is not None else max(_utcnow(), started_at)
        if ended_at < started_at:
            raise InvalidTurnError("ended_at is before started_at")
        calls = None if tool_calls is None else [_tool_call(c) for c in tool_calls]
        if self._recorder.redactor is not None:
            text = self._recorder._redacted(self.session_id, turn_index, text)
            if calls:
                calls = [self._recorder._redacted_call(self.session_id, turn_index, call) for call in calls]
        span = self._recorder._turn_span(self, "complete_turn", span_attributes, turn_index=turn_index,
                                         speaker=speaker)
        ticket = self._emit(
            TurnCompleted,
            span,
            turn_index=turn_index,
            speaker=speaker,
            text=text,
            started_at=started_at,
            ended_at=ended_at,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            tool_calls=calls,
            **({"barged_in": True} if barged_in else {}),
            **({"kind": written_kind} if written_kind is not None else {}),
            **({"out_of_context": True} if not in_context else {}),
        )
        self._open.pop(turn_index, None)
        self._completed.add(turn_index)
        self._next_turn_index = max(self._next_turn_index, turn_index + 1)
        await self._recorder._await_durable(ticket, span)

    async def flush_partial(self) -> None:
        """Spool every open turn's newest text now, if it changed, and wait as :meth:`complete_turn` does.

        Raises:
            SessionErasedError: the session was forgotten.
        """
        if self.erased:
            raise SessionErasedError(self.session_id)
        for ticket in self._emit_partials():
            await self._recorder._await_durable(ticket)

    async def end(self, reason: str = "completed", *, ended_at: dt.datetime | None = None) -> None:
        """Record ``session.ended`` after the open turns' newest partials (those
        turns are then kept as interrupted), and wait as :meth:`complete_turn` does
        for every event of the session still unacknowledged."""
        self._check_open()
        _check_name("reason", reason)
        self._emit_partials()
        last = self._next_turn_index - 1
        span = self._recorder._turn_span(self, "end_session", self._trace_attributes, reason=reason)
        ticket = self._emit(
            SessionEnded,
            span,
            ended_at=_checked_time(ended_at, "ended_at") if ended_at else _utcnow(),
            reason=reason,
            last_turn_index=last if last >= 0 else None,
        )
        self.closed = True
        self._open.clear()
        self._recorder._forget(self)
        await self._recorder._await_durable(ticket, span)

    async def wait_acknowledged(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit) until the broker acknowledged
        every event of this session spooled on this host (this recorder's, any a dead
        recorder left, any another live recorder here adopted); True if it did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return not await self._recorder._delivered(self.session_id, deadline)

    # -- internals -----------------------------------------------------------
    def _emit_partials(self) -> list[Ticket]:
        """Spool each open turn's newest text, if it changed, redacted (once per flush, not per
        update_partial) by the partial rule of ``turnlog.producers.pii``; a redacted text equal to
        the one spooled last (its tail held back) is not spooled again."""
        tickets = []
        for turn_index in sorted(self._open):
            turn = self._open[turn_index]
            if turn.dirty and turn.text is not None:
                text = turn.text
                if self._recorder.redactor is not None:
                    text = self._recorder._redacted(self.session_id, turn_index, text, partial=True)
                if text != turn.sent:
                    tickets.append(
                        self._emit(
                            TurnPartial, None, turn_index=turn_index, speaker=turn.speaker, text=text,
                            started_at=turn.started_at
                        )
                    )
                    turn.sent = text
                turn.dirty = False
        return tickets

    def _emit(self, event_type: type[Event], span: TraceSpan | None = None, **fields: Any) -> Ticket:
        """Build, check and spool one event; with ``span`` (a traced turn), its record carries the
        span's context in a ``traceparent`` header, and a refusal ends the span as failed.

        The check is the readers' own: the event is encoded and decoded with
        :func:`~turnlog.schemas.decode_event`, so the recorder refuses exactly what
        the sequencer and the sink would (ranges, the raw nesting bound, the
        free-form values' depth and size), whatever the caller's stack depth.
        """
        with ended_on_failure(span):
            ticket = self._emit_checked(event_type, span.context if span is not None else None, fields)
        self._next_seq += 1
        return ticket

    def _emit_checked(self, event_type: type[Event], trace: TraceContext | None, fields: dict[str, Any]) -> Ticket:
        tag = event_type.__struct_config__.tag
        try:
            event = event_type(
                event_id=uuid.uuid4(),
                session_id=self.session_id,
                seq=self._next_seq,
                epoch=self.epoch,
                producer_id=self._recorder.producer_id,
                emitted_at=_utcnow(),
                **fields,
            )  # __post_init__ checks the free-form values' bounds already (ValueError)
            payload = encode_event(event)
            decode_event(payload)  # the struct constructor does not check ranges; the schema does
            if self._sealer is not None:
                payload = encode_event(self._sealer.seal(event))
        except EventValidationError as e:
            raise InvalidTurnError(f"{tag}: {e.reason}") from e
        except ValueError as e:  # a struct's own check (schemas/events.py), raised on construction
            raise InvalidTurnError(f"{tag}: {e}") from e
        except (TypeError, msgspec.EncodeError) as e:
            raise InvalidTurnError(f"{tag}: cannot encode: {e}") from e
        except RecursionError as e:  # only with the caller's own stack nearly exhausted
            raise InvalidTurnError(f"{tag}: a value is nested too deep to encode here") from e
        if len(payload) > MAX_EVENT_BYTES:
            raise InvalidTurnError(
                f"{event_type.__struct_config__.tag}: the event is {len(payload)} bytes encoded; the limit is "
                f"{MAX_EVENT_BYTES} (Kafka's record size): shorten the text, tool calls or metadata"
            )
        return self._recorder._spool(self, payload, trace)  # raises SpoolFullError

    def _check_open(self) -> None:
        if self.erased:
            raise SessionErasedError(self.session_id)
        if self.closed:
            raise SessionClosedError(f"session {self.session_id} has ended; no more events can be recorded")

    def _check_turn(self, turn_index: int, speaker: str, text: str) -> None:
        if not _is_int(turn_index) or not 0 <= turn_index <= MAX_TURN_INDEX:
            raise InvalidTurnError(f"turn_index must be an int from 0 to {MAX_TURN_INDEX}, got {_shown(turn_index)}")
        if turn_index < self._first_turn_index or turn_index in self._completed:
            raise InvalidTurnError(
                f"turn {turn_index} of {self.session_id} is already recorded; a fresh turn index is"
                f" {self._next_turn_index}"
            )
        _check_name("speaker", speaker)
        if not isinstance(text, str):
            raise InvalidTurnError(f"text must be a str, got {type(text).__name__}")
        size = _utf8_size("text", text)
        limit = self._recorder.settings.max_text_bytes
        if size > limit:
            raise InvalidTurnError(f"text is {size} bytes; the limit is {limit} bytes (TURNLOG_MAX_TEXT_BYTES)")


class SessionRecorder:
    """Records sessions through a durable local spool and one idempotent Kafka producer.

    No I/O happens in the constructor; :meth:`start` (or ``async with``) opens
    the spool in ``settings.spool_dir``, adopts the spools of recorders that
    died on this host (their events are delivered first), and starts the
    drainer and the flush timer.

    :meth:`resume` gets its grant from ``resume_source`` (a
    :class:`~turnlog.producers.grant.ResumeSource`, closed by :meth:`close`); without one, from
    turnlog's API when ``settings.api_url`` is set (the agent host needs no database
    credentials). A host that holds the store passes
    ``resume_source=StoreResumeSource(settings)`` (``turnlog.resume_barrier``).

    ``redactor`` (default: made by :meth:`start` from ``settings.redaction``,
    ``TURNLOG_REDACTION``) masks personal data before anything is spooled:
    every completed turn's text and the string values of its tool calls'
    arguments and results, and every partial text by the stricter partial rule
    (``turnlog.producers.pii``). Session metadata, ids and names are not redacted.
    """

    def __init__(
        self,
        settings: TurnlogSettings | None = None,
        *,
        producer_id: str | None = None,
        producer_config: Mapping[str, Any] | None = None,
        resume_source: ResumeSource | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        self.settings = settings or TurnlogSettings()
        #: masks personal data in turn text before it is spooled (None: nothing is masked); made from
        #: ``settings.redaction`` by :meth:`start` unless given
        self.redactor = redactor
        self._redact_partial = partial_redaction(redactor) if redactor is not None else None
        self.producer_id = producer_id or f"recorder-{uuid.uuid4()}"
        config = kafka.producer_config(self.settings, client_id=self.producer_id)
        #: the erasure ledger, followed from start() to close()
        self._erasures = ErasureWatch(self.settings, relevant=self._matters, on_erased=self._on_erased)
        self._drainer = SpoolDrainer(
            Path(self.settings.spool_dir), {**config, **(producer_config or {})},
            max_bytes=self.settings.spool_max_bytes, erasure_check=self._erasures.check,
        )
        self._signer = RecordSigner(self.settings.fleet_key_rings())
        if resume_source is None and self.settings.api_url:
            resume_source = ApiResumeSource(self.settings.api_url, self.settings.api_token)
        #: where resume() gets its grant; None: resume() raises ConfigurationError
        self._resume_source = resume_source
        self._sessions: dict[str, RecordedSession] = {}
        self._timer: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # start()'s, where erasures are applied to sessions
        self._kek: KekPublicKey | None = None  # loaded by start()
        #: spans of turns (service_tracing: NO_TRACING unless TURNLOG_TRACING=on), set by start()
        self._tracing: Tracing = NO_TRACING
        self.terminating = asyncio.Event()

    @property
    def degraded(self) -> bool:
        """True while the recorder runs on its spool alone (see the module docstring)."""
        return self._drainer.degraded

    @property
    def encrypted(self) -> bool:
        """True once :meth:`start` found a KEK: every session's content is sealed before the spool."""
        return self._kek is not None

    @property
    def spool_path(self) -> Path | None:
        """This recorder's spool file (None before :meth:`start`)."""
        return self._drainer.path

    def spooled_events(self, session_id: str | None = None) -> int:
        """Events in the spool not yet acknowledged by the broker (of ``session_id``, or all)."""
        return self._drainer.pending(session_id)

    async def start(self) -> SessionRecorder:
        """Load the KEK (if any), make the redactor (if ``redaction`` is set and none was given),
        open the spool (adopting orphaned ones) and start delivery and the timer.

        Raises:
            KeyMaterialError: the configured KEK cannot be used, or ``encryption=required``
                and none is configured (``turnlog.crypto.config.recorder_kek``).
            ImportError: ``redaction=presidio`` without ``turnlog[presidio]`` installed.
            ConfigurationError: ``tracing`` is on without ``turnlog[otel]`` installed.
            SpoolError: ``spool_dir`` cannot be used.
        """
        self._tracing = service_tracing(self.settings, "recorder")
        self._kek = await asyncio.to_thread(recorder_kek, self.settings)
        if self.redactor is None and self.settings.redaction != "off":  # Presidio's takes about a second
            self.redactor = await asyncio.to_thread(redactor_from_settings, self.settings)
            self._redact_partial = partial_redaction(self.redactor) if self.redactor is not None else None
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._drainer.start)
        metrics.SPOOL_MAX_BYTES.set(self.settings.spool_max_bytes)
        self._erasures.start()  # after the drainer adopted orphans: the first pass reads the ledger for them
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
        """Open fleet ``fleet``'s new session ``session_id`` (epoch 0, seq 0); returns as
        :meth:`RecordedSession.complete_turn` does.

        The session is written under its key, ``"<fleet>:<session_id>"`` (the returned session's
        ``session_id``; ``turnlog/schemas/session_keys.py``): the store, the API, ``resume`` and
        ``turnlog forget`` name it by that key, and another fleet's session with the same id is
        another session.

        Raises:
            InvalidTurnError: a bad id (1 to 200 of ASCII letters, digits and ``._:@-``), a fleet
                that cannot name sessions (1 to 64 of ASCII letters, digits and ``._@-``), a bad
                agent id or metadata (not JSON-able, nested deeper than ``MAX_VALUE_DEPTH`` or over
                ``MAX_METADATA_BYTES`` encoded: ``turnlog.schemas.events``).
            SessionClosedError: this recorder already records the session.
            SessionErasedError: the session was forgotten (the erasure ledger named it).
            SpoolFullError, SpoolError: as :meth:`RecordedSession.complete_turn`.
        """
        self._require_started()
        _check_name("fleet", fleet)
        _check_name("agent_id", agent_id)
        try:
            key = session_key(fleet, session_id)
        except SessionKeyError as e:
            raise InvalidTurnError(f"start_session: {e}") from None
        self._check_not_recorded(key)
        self._check_signable(fleet, key)
        session = RecordedSession(
            self, key, fleet=fleet, epoch=0, next_seq=0, next_turn_index=0, kek=self._kek
        )
        ticket = session._emit(
            SessionStarted,
            None,
            fleet=fleet,
            agent_id=agent_id,
            started_at=_checked_time(started_at, "started_at") if started_at else _utcnow(),
            metadata=dict(metadata or {}),
        )
        self._open_session(session)
        await self._await_durable(ticket)
        return session

    async def resume(self, session_id: str, *, fleet: str | None = None,
                     timeout: float | None = None) -> RecordedSession:
        """Continue a session another process was recording, in a new epoch.

        ``session_id``: with ``fleet``, the id the agent gave :meth:`start_session` (the session
        resumed is ``"<fleet>:<session_id>"``, or, if the store has none, that fleet's session
        ``session_id`` from before per-fleet keys); without it, the session's key (as
        :attr:`RecordedSession.session_id` and the store name it; a session started before
        per-fleet keys: its bare id). The returned session's ``session_id`` says which.

        First delivers what this host's spools hold of the session (a recorder
        that died here left it behind; this recorder adopts it), and waits for
        another live recorder here that adopted it first to deliver it, so the
        resume position counts it. Then
        waits at the resume barrier (``turnlog/resume_barrier.py``, through the resume
        source given to the constructor, or the API) until the pipeline
        has applied everything the predecessor got acknowledged, claims the next
        epoch, and continues after the stored ``last_seq`` and the highest
        stored turn; :attr:`RecordedSession.turns` holds the stored conversation.
        The predecessor's unfinished turns stay as they are (marked interrupted
        once this epoch's first event is applied); new turns start after them.

        Raises:
            ResumeBarrierTimeout: this host's spools did not deliver the session's events
                (``undelivered_events`` says how many were left), or the pipeline did not
                catch up, within ``timeout`` seconds (default ``settings.resume_timeout_seconds``).
            SessionNotFoundError: the store has no such session (or none of ``fleet``, or the API
                token does not cover its fleet).
            InvalidTurnError: with ``fleet``, an id or a fleet that cannot make a session key.
            SessionErasedError: the session is being forgotten, or was (through the API).
            SessionClosedError: the session has ended.
            ConfigurationError: the recorder has no resume source (no ``resume_source`` and no
                ``TURNLOG_API_URL``).
        """
        self._require_started()
        if fleet is not None:
            try:
                session_id = session_key(fleet, session_id)
            except SessionKeyError as e:
                raise InvalidTurnError(f"resume: {e}") from None
        source = self._resume_source
        if source is None:
            raise ConfigurationError(
                f"resume of {session_id}: no resume source; set TURNLOG_API_URL (and TURNLOG_API_TOKEN) to resume "
                "through turnlog's API, or, on a host that holds the store, pass "
                "SessionRecorder(resume_source=StoreResumeSource(settings)) from turnlog.resume_barrier"
            )
        self._check_not_recorded(session_id)
        wait = timeout if timeout is not None else self.settings.resume_timeout_seconds
        deadline = time.monotonic() + wait
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._drainer.adopt_orphans())), wait)
        except TimeoutError as e:
            raise ResumeBarrierTimeout(f"resume of {session_id}: adopting this host's orphaned spools took over"
                                       f" {wait:.0f} s") from e
        # the key's events, and the bare id's a recorder of an earlier release may have left here
        held: dict[Path, int] = {}
        for spooled_id in {session_id, bare_id(session_id) or session_id}:
            for path, count in (await self._delivered(spooled_id, deadline)).items():
                held[path] = held.get(path, 0) + count
        if held:
            where = ", ".join(f"{count} in {path}" for path, count in held.items())
            raise ResumeBarrierTimeout(
                f"resume of {session_id}: {sum(held.values())} of its events in this host's spools ({where}) "
                f"were not delivered within {wait:.0f} s (is the broker reachable?)",
                undelivered_events=sum(held.values()),
            )
        grant = await source.grant(session_id, max(0.1, deadline - time.monotonic()))
        if grant is None or (fleet is not None and grant.fleet != fleet):
            raise SessionNotFoundError(f"no session {session_id} in the store")
        if not grants_as(session_id, grant.session_id, grant.fleet):
            raise RecorderError(f"resume of {session_id}: the resume source granted another session")
        session_id = grant.session_id  # the key, or the bare id of a session from before per-fleet keys
        if not grant.resumable:
            raise SessionClosedError(f"session {session_id} is {grant.status}; it cannot be resumed")
        if self._signer.enabled:
            if grant.fleet is None or grant.epoch_grant is None:
                raise RecorderError(
                    f"resume of {session_id}: the grant names no fleet or carries no epoch grant (set "
                    "TURNLOG_EPOCH_GRANT_KEY where resumes are granted): the sequencer would refuse the new epoch"
                )
            self._check_signable(grant.fleet, session_id)
        session = RecordedSession(
            self,
            session_id,
            fleet=grant.fleet,
            epoch_grant=grant.epoch_grant,
            epoch=grant.epoch,
            next_seq=grant.next_seq,
            next_turn_index=grant.next_turn_index,
            turns=grant.turns,
            kek=self._kek,
        )
        self._open_session(session)
        logger.info(
            "resumed %s at epoch %d, seq %d, turn %d", session_id, session.epoch, session.next_seq,
            session.next_turn_index
        )
        return session

    async def drain(self, timeout: float | None = None) -> bool:
        """Spool every open partial and wait up to ``timeout`` seconds (None: no limit)
        for all acknowledgements (the SIGTERM path); True if all were acknowledged.

        Correctness never depends on this: it only shortens what a planned stop loses.
        """
        for session in list(self._sessions.values()):
            session._emit_partials()
        results = await asyncio.gather(*(s.wait_acknowledged(timeout) for s in list(self._sessions.values())))
        return all(results)

    def install_sigterm_drain(self) -> None:
        """On SIGTERM: drain, then set :attr:`terminating` (the agent decides how to exit)."""
        loop = asyncio.get_running_loop()

        def on_sigterm() -> None:
            logger.info("SIGTERM: draining %d open sessions", len(self._sessions))
            task = loop.create_task(self.drain(self.settings.spool_close_timeout_seconds))
            task.add_done_callback(lambda _: self.terminating.set())

        loop.add_signal_handler(signal.SIGTERM, on_sigterm)

    async def close(self) -> None:
        """Stop the timer, spool every open partial, deliver the spool for up to
        ``spool_close_timeout_seconds``, and close it. Undelivered events stay
        in the spool file for the next recorder started with the same ``spool_dir``."""
        if self._timer is not None:
            self._timer.cancel()
            try:
                await self._timer
            except asyncio.CancelledError:
                pass
            except Exception:  # the timer must not keep close() from draining
                logger.exception("the partial timer had failed")
            self._timer = None
        for session in list(self._sessions.values()):
            try:
                session._emit_partials()
            except RecorderError as e:
                logger.error("session %s: partial not spooled at close: %s", session.session_id, e)
        await asyncio.to_thread(self._drainer.close, self.settings.spool_close_timeout_seconds)
        for session in list(self._sessions.values()):  # no longer recorded here (a later end() forgets nothing)
            self._forget(session)
        await asyncio.to_thread(self._erasures.close)
        if self._resume_source is not None:
            await asyncio.to_thread(self._resume_source.close)
        await asyncio.to_thread(self._tracing.flush)

    # -- internals -----------------------------------------------------------
    def _require_started(self) -> None:
        if self._timer is None:
            raise RecorderError("the recorder is not started: use `async with SessionRecorder(...)` or await start()")

    def _check_not_recorded(self, session_id: str) -> None:
        """Refuse to open ``session_id`` again while this recorder holds it.

        Raises:
            SessionErasedError: it was forgotten (the erasure ledger named it; it is being dropped).
            SessionClosedError: it is being recorded here.
        """
        held = self._sessions.get(session_id)
        if held is not None and held.erased:
            raise SessionErasedError(session_id)
        if held is not None:
            raise SessionClosedError(f"session {session_id} is already being recorded here")

    def _check_signable(self, fleet: str, session_id: str) -> None:
        """With fleet keys configured, refuse a session of a fleet whose key this recorder lacks: the
        sequencer would send every event of it to the DLQ."""
        if self._signer.enabled and not self._signer.can_sign(fleet):
            raise RecorderError(
                f"session {session_id}: no signing key for its fleet in TURNLOG_FLEET_KEYS (this recorder "
                "holds other fleets' keys); its events would be refused by the sequencer"
            )

    def _redacted(self, session_id: str, turn_index: int, text: str, *, partial: bool = False) -> str:
        """``text`` through the redactor (its partial rule with ``partial``).

        Raises:
            RecorderError: the redactor raised or returned no str; the message names the session
                and turn, never the text (the redactor's own error is not chained: it may quote it).
        """
        redact = self._redact_partial if partial else self.redactor
        assert redact is not None
        try:
            result = redact(text)
        except Exception as e:
            raise RecorderError(
                f"session {session_id}: the redactor raised {type(e).__name__} on turn {turn_index}"
            ) from None
        if not isinstance(result, str):
            raise RecorderError(
                f"session {session_id}: the redactor returned {type(result).__name__}, not str, on turn {turn_index}"
            )
        return result

    def _redacted_call(self, session_id: str, turn_index: int, call: ToolCall) -> ToolCall:
        """``call`` with every string value of its arguments and result redacted (keys and name kept)."""

        def redact(text: str) -> str:
            return self._redacted(session_id, turn_index, text)

        try:
            return ToolCall(
                name=call.name,
                arguments=redact_values(call.arguments, redact),
                result=redact_values(call.result, redact),
            )
        except ValueError as e:  # the schema's bounds, if the placeholders made a value longer
            raise InvalidTurnError(f"a tool call's {e}") from e

    def _turn_span(
        self, session: RecordedSession, name: str, framework: Mapping[str, str | int | bool], **attributes: Any
    ) -> TraceSpan | None:
        """The PRODUCER span of the event ``session`` is about to emit (None: tracing off or not sampled).
        Its attributes name the session, seq and epoch (never content), and the framework's ids."""
        if not self._tracing.sample_root():  # off, or this turn not sampled: nothing more is done
            return None
        attrs: dict[str, Any] = {
            **framework, **producer_attributes(self.settings.topics.events), "messaging.operation.name": name,
            "turnlog.session_id": session.session_id, "turnlog.seq": session.next_seq, "turnlog.epoch": session.epoch,
        }
        attrs.update((f"turnlog.{key}", value) for key, value in attributes.items())
        try:
            return self._tracing.start(name, kind="producer", attributes=attrs, sampled_root=True)
        except Exception as e:  # tracing must never cost a turn: recorded untraced
            logger.warning("session %s: tracing %s failed (%s): untraced", session.session_id, name, type(e).__name__)
            return None

    def _spool(self, session: RecordedSession, payload: bytes, trace: TraceContext | None = None) -> Ticket:
        key = session.session_id.encode("utf-8")
        headers: tuple[tuple[str, bytes], ...] = ()
        if self._signer.enabled and session.fleet is not None:
            headers = tuple(self._signer.headers(session.fleet, key, payload, session._epoch_grant))
        elif session.fleet is not None:  # open mode: the fleet it claims, so a collision is refused, not merged
            headers = tuple(claim_headers(session.fleet, session._epoch_grant))
        if trace is not None:  # kept in the spool row with the signature: an adopting recorder sends it too
            headers = (*headers, *trace.headers())
        event = SpooledEvent(
            self.settings.topics.events, key, payload, session.session_id, session.next_seq, headers=headers
        )
        [ticket] = self._drainer.submit([event])
        return ticket

    async def _await_durable(self, ticket: Ticket, span: TraceSpan | None = None) -> None:
        """Wait until ``ticket`` is spooled, then for its ack up to ``ack_wait_seconds``
        (not at all while degraded). ``span`` (a traced turn) gets the events ``spool.fsync``
        and ``broker.ack`` at the times they happened, or ``turnlog.degraded`` when the
        turn returned on the spool alone, and ends here."""
        if span is None:
            await self._await_durable_untraced(ticket)
            return
        # The futures resolve on the drainer's thread: each callback notes when, the span is told here.
        marks: dict[str, int] = {}
        ticket.spooled.add_done_callback(lambda _: marks.setdefault("spool.fsync", time.time_ns()))
        ticket.acked.add_done_callback(lambda _: marks.setdefault("broker.ack", time.time_ns()))
        failed = False
        try:
            await self._await_durable_untraced(ticket)
        except BaseException as e:
            failed = True
            span.fail(type(e).__name__)
            raise
        finally:
            noted = dict(marks)  # one copy: the ack of a degraded turn may still arrive meanwhile
            try:
                for name, at_ns in sorted(noted.items(), key=lambda mark: mark[1]):
                    span.event(name, at_ns=at_ns)
                if not failed and "broker.ack" not in noted:
                    span.set({"turnlog.degraded": True})  # returned on the spool alone
                span.end()
            except Exception as e:  # the turn is spooled: a tracing failure must not make it look refused
                logger.warning("ending a turn's span failed (%s)", type(e).__name__)

    async def _await_durable_untraced(self, ticket: Ticket) -> None:
        await asyncio.shield(asyncio.wrap_future(ticket.spooled))  # raises SpoolError
        if self._drainer.degraded:
            return
        wait = self.settings.ack_wait_seconds
        acked = asyncio.wrap_future(ticket.acked)
        # A failure after we stopped waiting (close()) is the drainer's to report, not this caller's.
        acked.add_done_callback(lambda f: f.cancelled() or f.exception())
        done, _ = await asyncio.wait({acked}, timeout=wait)  # never cancels the ack on a timeout
        if done:
            acked.result()  # raises SpoolError for an event the producer refused for good
        else:
            self._drainer.note_slow_ack(wait)

    async def _delivered(self, session_id: str, deadline: float | None) -> dict[Path, int]:
        """Wait until the broker acknowledged every event of ``session_id`` held in this host's
        spools, or ``deadline`` (monotonic; None: no limit) passed; returns what is still held
        then, ``{spool path: events}`` (empty: all delivered).

        Not only this recorder's spool: another live recorder here may have adopted the dead
        predecessor's spool and not delivered it yet (the broker was away). Claiming the next
        epoch before it has would let the old epoch's events land after the resume position,
        where the sequencer applies them ahead of the new epoch's (a turn said twice). While
        waiting, a spool whose recorder died meanwhile is adopted and delivered here.
        """
        while True:
            own = self._drainer.pending(session_id)
            if own:
                held = {self._drainer.path or Path(self.settings.spool_dir): own}
            else:
                held = await asyncio.to_thread(self._drainer.held_elsewhere, session_id)
                if not held:
                    return held
            if deadline is not None and time.monotonic() >= deadline:
                return held
            if own:
                await asyncio.sleep(_SPOOL_POLL_SECONDS)
            else:  # another recorder's spool: adopt it if that recorder died meanwhile
                await asyncio.sleep(_OTHER_SPOOLS_POLL_SECONDS)
                await asyncio.wrap_future(self._drainer.adopt_orphans())

    def _matters(self, session_id: str) -> bool:
        """Whether an erasure of ``session_id`` concerns this recorder: it records the session, or
        its spool holds events of it (the erasure watch's thread asks)."""
        return session_id in self._sessions or self._drainer.holds(session_id)

    def _of_its_fleet(self, erasure: Erasure) -> bool:
        """Whether ``erasure`` names the fleet of the session held here under its id: the one this
        recorder records, else the fleets the spool's events of it claim (True when neither says)."""
        session = self._sessions.get(erasure.session_id)
        if session is not None and session.fleet is not None:
            return session.fleet == erasure.fleet
        held = self._drainer.fleets_held(erasure.session_id)
        return not held or erasure.fleet in held

    def _on_erased(self, erasures: list[Erasure]) -> None:
        """The erasure ledger names sessions that matter here (on the erasure watch's thread): the
        drainer refuses their events and drops what the spool holds of them, then their sessions
        refuse every write (in that order: an event emitted in between is dropped with the rest).

        An erasure is bound to its fleet: one naming another fleet than the session this recorder
        records under that id, or than the fleets its spooled events of the id claim, changes
        nothing here."""
        erasures = [erasure for erasure in erasures if self._of_its_fleet(erasure)]
        self._drainer.forget({erasure.session_id for erasure in erasures})
        for erasure in erasures:
            session = self._sessions.get(erasure.session_id)
            if session is None or session.erased:
                continue
            session.erased = True
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to tell
                    loop.call_soon_threadsafe(self._drop_erased, session, erasure.reason)

    def _drop_erased(self, session: RecordedSession, reason: str) -> None:
        """Stop flushing a forgotten session's partials; logged once (its id and why, never content)."""
        session._open.clear()
        self._forget(session)
        logger.warning("session %s was forgotten (erasure ledger, reason %s): its undelivered events were dropped "
                       "from the spool and further writes raise SessionErasedError", session.session_id, reason)

    def _open_session(self, session: RecordedSession) -> None:
        """Record ``session`` as open here (``turnlog_recorder_sessions_open`` counts it until :meth:`_forget`)."""
        self._sessions[session.session_id] = session
        metrics.RECORDER_SESSIONS_OPEN.inc()

    def _forget(self, session: RecordedSession) -> None:
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]
            metrics.RECORDER_SESSIONS_OPEN.dec()

    async def _flush_partials_forever(self) -> None:
        interval = self.settings.flush_interval_seconds
        while True:
            await asyncio.sleep(interval)
            for session in list(self._sessions.values()):
                if session.erased:
                    continue  # refused, and logged once by _drop_erased
                try:
                    session._emit_partials()
                except RecorderError as e:  # one session's problem (a full spool) must not stop the others' flushes
                    logger.error("session %s: partial not spooled: %s", session.session_id, e)


def _utf8_size(name: str, value: str) -> int:
    """Bytes of ``value`` in UTF-8; NUL and lone surrogates are refused (the store cannot hold them)."""
    if "\x00" in value:
        raise InvalidTurnError(f"{name} contains a NUL character")
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidTurnError(f"{name} is not valid Unicode text: {e.reason} at {e.start}") from e


def _trace_attributes(attributes: object) -> dict[str, str | int | bool]:
    """``attributes`` checked against :meth:`RecordedSession.set_trace_attributes`'s bounds, as a dict.

    Raises:
        InvalidTurnError: a bound or a type is broken.
    """
    if not isinstance(attributes, Mapping):
        raise InvalidTurnError(f"trace attributes must be a mapping, got {type(attributes).__name__}")
    if len(attributes) > MAX_TRACE_ATTRIBUTES:
        raise InvalidTurnError(f"{len(attributes)} trace attributes; the limit is {MAX_TRACE_ATTRIBUTES} per span")
    checked: dict[str, str | int | bool] = {}
    size = 0
    for key, value in attributes.items():
        if not (isinstance(key, str) and 0 < len(key) <= MAX_TRACE_KEY_CHARS and key.isascii() and key.isprintable()
                and " " not in key):
            raise InvalidTurnError(
                f"a trace attribute name must be 1 to {MAX_TRACE_KEY_CHARS} printable ASCII characters without"
                f" spaces, got {key!r:.80}"
            )
        if key.startswith(RESERVED_TRACE_PREFIXES):
            raise InvalidTurnError(f"trace attribute {key!r}: names starting with turnlog. or messaging. are turnlog's")
        if isinstance(value, str):
            length = _utf8_size(f"trace attribute {key!r}", value)
            if length > MAX_TRACE_VALUE_BYTES:
                raise InvalidTurnError(
                    f"trace attribute {key!r} is {length} bytes; the limit is {MAX_TRACE_VALUE_BYTES}"
                )
        elif isinstance(value, bool):
            length = 1
        elif isinstance(value, int):
            if not -(2**63) <= value < 2**63:
                raise InvalidTurnError(f"trace attribute {key!r} is outside the 64-bit integers")
            length = 8
        else:
            raise InvalidTurnError(f"trace attribute {key!r} must be a str, int or bool, got {type(value).__name__}")
        size += len(key) + length
        checked[key] = value
    if size > MAX_TRACE_ATTRIBUTES_BYTES:
        raise InvalidTurnError(
            f"the trace attributes are {size} bytes; the limit is {MAX_TRACE_ATTRIBUTES_BYTES} per span"
        )
    return checked


def _check_name(name: str, value: object) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise InvalidTurnError(f"{name} must be a non-empty str of at most {MAX_NAME_CHARS} chars, got {_shown(value)}")
    _utf8_size(name, value)


def _shown(value: object) -> str:
    """``value`` as an error message shows it: a number, a bool, None or a datetime as it is,
    anything else by its type and size only. A wrong value may be transcript text or a tool's
    arguments (which encryption would have sealed), and the adapters log these errors."""
    if value is None or isinstance(value, (bool, int, float, dt.datetime)):
        text = repr(value)
        return text if len(text) <= MAX_SHOWN_CHARS else f"{type(value).__name__} of {len(text)} characters"
    if isinstance(value, (str, bytes, Mapping, list, tuple)):
        return f"{type(value).__name__} of length {len(value)}"
    return type(value).__name__


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_time(value: object, name: str) -> dt.datetime:
    if not isinstance(value, dt.datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTurnError(f"{name} must be a timezone-aware datetime, got {_shown(value)}")
    if not EARLIEST_YEAR <= value.year <= LATEST_YEAR:
        raise InvalidTurnError(f"{name} must fall in the years {EARLIEST_YEAR}..{LATEST_YEAR}, got {value!r}")
    return value.astimezone(dt.UTC)


def _written_kind(kind: object) -> str | None:
    """A turn's ``kind`` as ``TurnCompleted.kind`` carries it: None for a spoken turn (None or
    ``"spoken"``), else the :class:`TurnKind` value.

    Raises:
        InvalidTurnError: ``kind`` is no :class:`TurnKind` value.
    """
    if kind is None:
        return None
    if not isinstance(kind, str) or kind not in TurnKind._value2member_map_:
        raise InvalidTurnError(f"kind must be one of {[k.value for k in TurnKind]} or None, got {_shown(kind)}")
    return None if kind == TurnKind.SPOKEN else str(TurnKind(kind).value)


def _tool_call(call: ToolCall | Mapping[str, Any]) -> ToolCall:
    if isinstance(call, ToolCall):
        return call
    if not isinstance(call, Mapping) or "name" not in call:
        got = "a mapping without 'name'" if isinstance(call, Mapping) else _shown(call)
        raise InvalidTurnError(f"a tool call must be a ToolCall or a mapping with 'name', got {got}")
    arguments = call.get("arguments", {})
    if not isinstance(arguments, Mapping):
        raise InvalidTurnError(f"a tool call's arguments must be a mapping, got {type(arguments).__name__}")
    try:
        return ToolCall(name=call["name"], arguments=dict(arguments), result=call.get("result"))
    except ValueError as e:  # the schema's bounds on arguments and result (ToolCall.__post_init__)
        raise InvalidTurnError(f"a tool call's {e}") from e
    except TypeError as e:
        raise InvalidTurnError(f"a tool call cannot be encoded: {e}") from e
