"""OpenTelemetry traces of a turn's journey (optional extra ``turnlog[otel]``).

One trace per turn (docs/design.md, "Observability", "Traces"): the recorder's
``complete_turn`` span (PRODUCER) starts it; its W3C context travels in the
``traceparent`` (and ``tracestate``) header of the event's record, through the
spool, to the sequencer, whose CONSUMER span (child of it) puts its own context
on the transcript record it emits; the sink's batch span (CONSUMER) links to
every record's context (one batch serves many turns: links, not parents, as
OTel's messaging conventions say) and holds a ``finalize`` span per session it
finalizes, linked to the session's ``session.ended`` record.

Off and free by default: without ``TURNLOG_TRACING=on`` every service gets
:data:`NO_TRACING`, whose ``enabled`` is False; callers test that one attribute
and do nothing else per event (no header, no span, no allocation). With it on
and the extra missing, :func:`service_tracing` raises
:class:`~turnlog.exceptions.ConfigurationError` at start-up.

Configuration: ``TURNLOG_TRACE_SAMPLE_RATIO`` (0..1) samples the recorder's turn
traces (a draw per new trace, before any OpenTelemetry call, so an unsampled
turn costs one random number; parent-based after that: the sequencer's and the
sink's spans follow the turn's decision; the sink's batch span is recorded when
one of its links is sampled). The exporter is OTLP/HTTP protobuf and reads OTel's own environment
variables (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
default ``http://localhost:4318/v1/traces``; ``OTEL_EXPORTER_OTLP_HEADERS``,
``..._TIMEOUT``, ...); the service name is ``OTEL_SERVICE_NAME`` if set, else
``turnlog-<component>``. Spans go through a ``BatchSpanProcessor`` and are
flushed by :meth:`Tracing.flush` on a clean stop (and at interpreter exit).

Hostile headers: a record's headers are read by :func:`context_from_headers`,
which looks at no more than :data:`MAX_HEADERS_SCANNED` headers, accepts a
``traceparent`` only in the W3C version-00 form (55 ASCII bytes, non-zero ids)
and only when exactly one is present, and a ``tracestate`` of at most
:data:`MAX_TRACESTATE_BYTES` of W3C list members (else dropped before OpenTelemetry
sees it, since it would log the refused text per record). Anything else is ignored: the record is processed
untraced, never refused for its trace headers.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import logging
import os
import random
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from turnlog.exceptions import ConfigurationError
from turnlog.settings import TurnlogSettings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "TraceContext", "Tracing", "TraceSpan", "NO_TRACING", "service_tracing", "context_from_headers",
    "parse_traceparent", "TRACEPARENT", "TRACESTATE", "MAX_HEADERS_SCANNED", "MAX_TRACESTATE_BYTES",
    "MAX_LINKS", "SpanKindName", "AttributeValue", "flush_all", "ended_on_failure", "batch_scope", "batch_span",
    "finalization_span",
    "producer_attributes", "consumer_attributes",
]

logger = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: Headers of one record looked at for a trace context, at most (a record may carry thousands).
MAX_HEADERS_SCANNED = 32
#: Longest ``tracestate`` carried on (W3C: 32 members of at most 256 characters; 512 is what it
#: asks every vendor to propagate at least).
MAX_TRACESTATE_BYTES = 512
#: Links on one span, at most (a sink batch of 10,000 records links to the first ones; the
#: rest are counted in ``turnlog.links_dropped``).
MAX_LINKS = 64
_TRACEPARENT_BYTES = 55  # "00-" 32 hex "-" 16 hex "-" 2 hex
_TRACEPARENT = re.compile(rb"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_SAMPLED = 0x01
# A tracestate list member (W3C Trace Context, "tracestate Header Field Values"): key "=" value.
_TRACESTATE_MEMBER = re.compile(
    r"([a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
_TRACESTATE_MEMBERS = 32

SpanKindName = Literal["producer", "consumer", "internal"]
AttributeValue = str | int | bool | float


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A W3C trace context: 128-bit trace id, 64-bit span id, trace flags, and the
    ``tracestate`` text (empty: none). Plain data: no OpenTelemetry import needed."""

    trace_id: int
    span_id: int
    flags: int = _SAMPLED
    tracestate: str = ""

    @property
    def sampled(self) -> bool:
        return bool(self.flags & _SAMPLED)

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"

    def headers(self) -> tuple[tuple[str, bytes], ...]:
        """The record headers that carry this context (``traceparent``, and ``tracestate`` if any)."""
        parent = (TRACEPARENT, self.traceparent.encode("ascii"))
        return (parent, (TRACESTATE, self.tracestate.encode("ascii"))) if self.tracestate else (parent,)


def parse_traceparent(value: bytes | str | None, tracestate: bytes | str | None = None) -> TraceContext | None:
    """The context of a W3C ``traceparent`` value (version 00, lower-case hex, ids not all
    zero), with ``tracestate`` if it is at most ``MAX_TRACESTATE_BYTES`` of W3C list members
    (at most 32, keys distinct; else dropped); None for anything else. Never raises for what
    the value holds."""
    if isinstance(value, str):
        if len(value) != _TRACEPARENT_BYTES or not value.isascii():
            return None
        value = value.encode("ascii")
    if not isinstance(value, bytes | bytearray) or len(value) != _TRACEPARENT_BYTES:
        return None
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return None
    return TraceContext(trace_id, span_id, int(match[3], 16), _tracestate(tracestate))


def _tracestate(value: bytes | str | None) -> str:
    if isinstance(value, bytes | bytearray):
        if len(value) > MAX_TRACESTATE_BYTES:
            return ""
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return ""
    if not isinstance(value, str) or len(value) > MAX_TRACESTATE_BYTES or not value.isascii():
        return ""
    if not value.isprintable():
        return ""
    # W3C's list grammar, as OpenTelemetry's TraceState checks it: a value it would refuse is
    # dropped here, silently, instead of being logged (with its text) by OpenTelemetry per record.
    keys = []
    for member in value.split(","):
        member = member.strip(" \t")  # optional whitespace (RFC 9110, 5.6.3)
        if not member:
            continue  # an empty list member is allowed
        match = _TRACESTATE_MEMBER.fullmatch(member)
        if match is None:
            return ""
        keys.append(match[1])
    return value if len(keys) <= _TRACESTATE_MEMBERS and len(set(keys)) == len(keys) else ""


def context_from_headers(headers: Any) -> TraceContext | None:
    """The trace context a record's headers carry, or None.

    ``headers``: confluent-kafka's list of ``(name, value)`` pairs, aiokafka's tuple of
    them, a mapping, or None; names may be str or bytes (an unreadable name is skipped).
    At most :data:`MAX_HEADERS_SCANNED` headers are looked at; two ``traceparent``
    headers are ambiguous and give None (W3C). Never raises for what the record holds."""
    if not headers:
        return None
    try:
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        parent: Any = None
        state: Any = None
        for index, pair in enumerate(pairs):
            if index >= MAX_HEADERS_SCANNED:
                break
            name, value = pair
            if isinstance(name, bytes):
                name = name.decode("ascii", "replace")
            if name == TRACEPARENT:
                if parent is not None:
                    return None
                parent = value
            elif name == TRACESTATE and state is None:
                state = value
        return parse_traceparent(parent, state) if parent is not None else None
    except Exception:  # a hostile or odd shape: untraced, never a failure of the record
        return None


class TraceSpan:
    """One recording span, in turnlog's words (the OpenTelemetry span stays inside this module).

    Thread-safe as OpenTelemetry's SDK span is; :meth:`end` is idempotent."""

    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    @property
    def context(self) -> TraceContext:
        """This span's context, to carry on in a record's headers."""
        ctx = self._span.get_span_context()
        state = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items()) if ctx.trace_state else ""
        return TraceContext(ctx.trace_id, ctx.span_id, int(ctx.trace_flags), state)

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None,
              at_ns: int | None = None) -> None:
        """A span event ``name`` at ``at_ns`` (``time.time_ns()``; default now)."""
        self._span.add_event(name, dict(attributes or {}), timestamp=at_ns)

    def set(self, attributes: Mapping[str, AttributeValue]) -> None:
        self._span.set_attributes(dict(attributes))

    def fail(self, description: str) -> None:
        """Mark the span's status as an error; ``description`` names what failed (never content)."""
        from opentelemetry.trace import Status, StatusCode

        self._span.set_status(Status(StatusCode.ERROR, description[:200]))

    def end(self, at_ns: int | None = None) -> None:
        if self._span.is_recording():
            self._span.end(end_time=at_ns)


class Tracing:
    """A service's tracer. :data:`NO_TRACING` (``enabled`` False) does nothing; one made by
    :func:`service_tracing` records spans and exports them by OTLP/HTTP."""

    def __init__(self, provider: TracerProvider | None = None, component: str = "", ratio: float = 1.0) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("turnlog", _version()) if provider is not None else None
        #: True when spans are recorded and exported; callers test it before any tracing work
        self.enabled = provider is not None
        self.component = component
        #: the share of new traces recorded (TURNLOG_TRACE_SAMPLE_RATIO)
        self.ratio = ratio
        self._draw = random.Random().random

    def sample_root(self) -> bool:
        """Whether to start a new trace: True with probability ``ratio`` (False when off). Drawn
        here, before the SDK is called, so an unsampled turn costs one draw and nothing else."""
        return self._tracer is not None and self._draw() < self.ratio

    def start(
        self,
        name: str,
        *,
        kind: SpanKindName = "internal",
        parent: TraceContext | TraceSpan | None = None,
        links: Iterable[TraceContext] = (),
        attributes: Mapping[str, AttributeValue] | None = None,
        at_ns: int | None = None,
        sampled_root: bool = False,
    ) -> TraceSpan | None:
        """Start a span (None when tracing is off or it is not sampled). ``parent``: a remote
        context (a record's) or a local span, whose sampled flag decides; without one, a span is
        recorded if ``sampled_root`` (the caller drew :meth:`sample_root`), or one of its
        ``links`` is sampled (a sink batch serving a sampled turn), or a draw at ``ratio`` says
        so. ``links`` are capped at :data:`MAX_LINKS` (the number left out goes in the
        attribute ``turnlog.links_dropped``)."""
        if self._tracer is None:
            return None
        if parent is None and not sampled_root:
            links = list(links)
            if not any(link.sampled for link in links) and not self.sample_root():
                return None
        from opentelemetry import trace
        from opentelemetry.trace import Link, SpanKind

        context = None
        if isinstance(parent, TraceSpan):
            context = trace.set_span_in_context(parent._span)
        elif parent is not None:
            context = trace.set_span_in_context(trace.NonRecordingSpan(_span_context(parent)))
        chosen: list[Link] = []
        dropped = 0
        for link in links:
            if len(chosen) < MAX_LINKS:
                chosen.append(Link(_span_context(link)))
            else:
                dropped += 1
        attrs = dict(attributes or {})
        if dropped:
            attrs["turnlog.links_dropped"] = dropped
        span = self._tracer.start_span(
            name, context=context, kind=_KINDS[kind](SpanKind), attributes=attrs, links=chosen, start_time=at_ns,
        )
        return TraceSpan(span) if span.is_recording() else None

    def flush(self, timeout_seconds: float = 5.0) -> bool:
        """Export every ended span now (a clean stop calls it), waiting at most ``timeout_seconds``;
        True if all were exported in time. The export goes on past the deadline on a thread of its
        own: OpenTelemetry's own flush waits for an export in flight (up to the exporter's timeout,
        10 s by default), which a collector that never answers would add to every stop."""
        provider = self._provider
        if provider is None:
            return True
        return _bounded(lambda: bool(provider.force_flush(int(timeout_seconds * 1000))), timeout_seconds)


#: Tracing off: the default of every service.
NO_TRACING = Tracing()

_KINDS = {
    "producer": lambda kinds: kinds.PRODUCER,
    "consumer": lambda kinds: kinds.CONSUMER,
    "internal": lambda kinds: kinds.INTERNAL,
}
_providers: dict[tuple[str, ...], Tracing] = {}
_providers_lock = threading.Lock()


def service_tracing(settings: TurnlogSettings, component: str) -> Tracing:
    """The tracer of ``component`` (``recorder``, ``sequencer``, ``sink``, ``finalizer``):
    :data:`NO_TRACING` unless ``settings.tracing``; one per component, exporter endpoint
    and sample ratio in a process (services run in one process share it).

    Raises:
        ConfigurationError: tracing is on and ``turnlog[otel]`` is not installed.
    """
    if not settings.tracing:
        return NO_TRACING
    endpoint = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or "")
    service = os.environ.get("OTEL_SERVICE_NAME") or f"turnlog-{component}"
    key = (component, service, endpoint, repr(settings.trace_sample_ratio))
    with _providers_lock:
        tracing = _providers.get(key)
        if tracing is None:
            tracing = _providers[key] = new_tracing(component, settings.trace_sample_ratio, service=service)
    return tracing


def new_tracing(component: str, ratio: float, *, service: str | None = None, processor: Any = None) -> Tracing:
    """A recording tracer of its own (not cached: :func:`service_tracing` is what services use):
    ``service`` its ``service.name`` (default ``turnlog-<component>``), ``processor`` an
    OpenTelemetry span processor (default a ``BatchSpanProcessor`` to OTLP/HTTP, configured by
    OTel's environment variables). The SDK's sampler is parent-based, recording every root:
    :meth:`Tracing.start` decides roots itself, at ``ratio``.

    Raises:
        ConfigurationError: ``turnlog[otel]`` is not installed.
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
    except ImportError as e:
        raise ConfigurationError(
            f"TURNLOG_TRACING is on but OpenTelemetry is not installed ({e.name}): pip install 'turnlog[otel]',"
            " or set TURNLOG_TRACING=off"
        ) from e
    provider = TracerProvider(
        sampler=ParentBased(root=ALWAYS_ON),
        resource=Resource.create({"service.name": service or f"turnlog-{component}"}),
        shutdown_on_exit=False,  # flush_all at exit, once for every provider
    )
    provider.add_span_processor(processor if processor is not None else BatchSpanProcessor(OTLPSpanExporter()))
    return Tracing(provider, component, ratio)


def _span_context(context: TraceContext) -> Any:
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState

    state = TraceState.from_header([context.tracestate]) if context.tracestate else None
    return SpanContext(context.trace_id, context.span_id, is_remote=True, trace_flags=TraceFlags(context.flags),
                       trace_state=state)


def flush_all(timeout_seconds: float = 5.0) -> None:
    """Flush and shut down every tracer of this process (registered to run at exit)."""
    with _providers_lock:
        tracings = list(_providers.values())
        _providers.clear()
    for tracing in tracings:
        provider = tracing._provider
        if provider is not None:
            # Bounded as Tracing.flush is: a hung collector must not hold the process's exit.
            _bounded(functools.partial(_flush_and_shut_down, provider, timeout_seconds), timeout_seconds)


def _flush_and_shut_down(provider: Any, timeout_seconds: float) -> bool:
    flushed = bool(provider.force_flush(int(timeout_seconds * 1000)))
    provider.shutdown()
    return flushed


def _bounded(call: Any, timeout_seconds: float) -> bool:
    """``call()`` on a daemon thread, waited for at most ``timeout_seconds``: its result, or False
    when it did not return in time (it goes on; a daemon thread does not hold the exit)."""
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(bool(call())), name="turnlog-trace-flush", daemon=True)
    try:
        worker.start()
    except RuntimeError:  # at interpreter exit, where Python 3.12 starts no thread: called here, unbounded
        return bool(call())
    worker.join(timeout_seconds)
    return bool(result and result[0])


atexit.register(flush_all)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("turnlog")
    except PackageNotFoundError:
        return "0"


# -- a batch's scope: finalization spans inside the sink's transaction ---------------------------
@dataclass(slots=True)
class _BatchScope:
    tracing: Tracing
    span: TraceSpan
    #: session id -> the context of its session.ended record in this batch
    ended: dict[str, TraceContext]


_batch: contextvars.ContextVar[_BatchScope | None] = contextvars.ContextVar("turnlog_trace_batch", default=None)


@contextlib.contextmanager
def batch_scope(tracing: Tracing, span: TraceSpan | None, ended: dict[str, TraceContext]) -> Iterator[None]:
    """Within it (the sink's batch transaction), :func:`finalization_span` makes spans that are
    children of ``span`` and link to the session's ``session.ended`` context from ``ended``."""
    if span is None:
        yield
        return
    token = _batch.set(_BatchScope(tracing, span, ended))
    try:
        yield
    finally:
        _batch.reset(token)


def batch_span() -> TraceSpan | None:
    """The span of the traced batch being applied (:func:`batch_scope`), or None."""
    scope = _batch.get()
    return scope.span if scope is not None else None


@contextlib.contextmanager
def ended_on_failure(span: TraceSpan | None) -> Iterator[None]:
    """Around work ``span`` traces: when the block raises, mark ``span`` failed (the
    exception's class name, never its text) and end it, then let the exception go on; when
    it does not, leave ``span`` open for its caller to finish. ``span`` None: nothing."""
    try:
        yield
    except BaseException as e:
        if span is not None:
            span.fail(type(e).__name__)
            span.end()
        raise


@contextlib.contextmanager
def finalization_span(session_id: str) -> Iterator[TraceSpan | None]:
    """A ``finalize`` span around one session's guarded finalize, inside a traced batch
    (:func:`batch_scope`); yields None (and costs one context-variable read) elsewhere."""
    scope = _batch.get()
    if scope is None:
        yield None
        return
    ended = scope.ended.get(session_id)
    try:
        span = scope.tracing.start(
            "finalize", parent=scope.span, links=(ended,) if ended is not None else (),
            attributes={"turnlog.session_id": session_id},
        )
    except Exception as e:  # inside the sink's transaction: tracing must never fail it
        logger.warning("tracing the finalization of %s failed (%s): untraced", session_id, type(e).__name__)
        span = None
    try:
        yield span
    finally:
        if span is not None:
            span.end()


def producer_attributes(topic: str) -> dict[str, AttributeValue]:
    """OTel messaging attributes of a record sent to ``topic``."""
    return {"messaging.system": "kafka", "messaging.destination.name": topic, "messaging.operation.type": "send"}


def consumer_attributes(topic: str, partition: int, offset: int | None = None,
                        group: str | None = None) -> dict[str, AttributeValue]:
    """OTel messaging attributes of processing a record (or a batch: ``offset`` None) of ``topic``."""
    attrs: dict[str, AttributeValue] = {
        "messaging.system": "kafka", "messaging.destination.name": topic,
        "messaging.destination.partition.id": str(partition), "messaging.operation.type": "process",
    }
    if offset is not None:
        attrs["messaging.kafka.offset"] = offset
    if group is not None:
        attrs["messaging.consumer.group.name"] = group
    return attrs
