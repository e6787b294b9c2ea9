"""A small OTLP/HTTP trace receiver for tests (the real protocol: ``POST /v1/traces`` with a protobuf
``ExportTraceServiceRequest``, decoded with opentelemetry-proto), and a timeline printer of one trace.

The receiver keeps every span it is sent, flattened to :class:`ReceivedSpan` (ids as ints). Bodies
are bounded (``MAX_BODY_BYTES``); a body it cannot decode is answered 400 and counted.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

MAX_BODY_BYTES = 16 * 1024 * 1024
_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[tuple[str, int], ...]  # (name, time ns)
    links: tuple[tuple[int, int], ...]  # (trace id, span id)


def _value(any_value: Any) -> Any:
    which = any_value.WhichOneof("value")
    return getattr(any_value, which) if which else None


def _id(raw: bytes) -> int | None:
    return int.from_bytes(raw, "big") if raw else None


def decode_spans(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    service=str(resource.get("service.name", "")),
                    name=span.name,
                    kind=_KINDS.get(span.kind, str(span.kind)),
                    trace_id=_id(span.trace_id) or 0,
                    span_id=_id(span.span_id) or 0,
                    parent_span_id=_id(span.parent_span_id),
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    attributes={kv.key: _value(kv.value) for kv in span.attributes},
                    events=tuple((event.name, event.time_unix_nano) for event in span.events),
                    links=tuple((_id(link.trace_id) or 0, _id(link.span_id) or 0) for link in span.links),
                ))
    return spans


class OtlpReceiver:
    """``with OtlpReceiver() as receiver:``; export to ``receiver.endpoint`` (the base URL: the
    exporters append ``/v1/traces``); :meth:`spans` returns what arrived so far."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.refused = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                if self.path != "/v1/traces" or not 0 < length <= MAX_BODY_BYTES:
                    receiver._refuse(self, 404 if self.path != "/v1/traces" else 413)
                    return
                body = self.rfile.read(length)
                try:
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    request = ExportTraceServiceRequest.FromString(body)
                except Exception:
                    receiver._refuse(self, 400)
                    return
                with receiver._lock:
                    receiver._spans.extend(decode_spans(request))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    def _refuse(self, handler: BaseHTTPRequestHandler, status: int) -> None:
        with self._lock:
            self.refused += 1
        handler.send_response(status)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def journey(spans: Iterable[ReceivedSpan], trace_id: int) -> list[ReceivedSpan]:
    """The spans of one turn's journey: those of ``trace_id``, those linking to one of them (the
    sink's batch), and those under a linking span (its ``finalize`` children), by start time."""
    spans = list(spans)
    members = {s.span_id for s in spans if s.trace_id == trace_id}
    found = {s.span_id: s for s in spans if s.trace_id == trace_id or any(t == trace_id for t, _ in s.links)}
    grew = True
    while grew:
        grew = False
        for span in spans:
            if span.span_id not in found and span.parent_span_id in found and span.parent_span_id not in members:
                found[span.span_id] = span
                grew = True
    return sorted(found.values(), key=lambda s: s.start_ns)


def timeline(spans: Iterable[ReceivedSpan]) -> str:
    """One trace as text: per span its name, service, start offset and duration (ms from the
    first span's start), and its events at their offsets."""
    spans = sorted(spans, key=lambda s: s.start_ns)
    if not spans:
        return "(no spans)"
    zero = spans[0].start_ns
    lines = [f"{'span':<48} {'service':<18} {'start ms':>9} {'dur ms':>8}  events (ms)"]
    for span in spans:
        events = ", ".join(f"{name} @{(at - zero) / 1e6:.1f}" for name, at in span.events)
        label = span.name if span.trace_id == spans[0].trace_id else f"{span.name} (linked)"
        lines.append(
            f"{label:<48} {span.service:<18} {(span.start_ns - zero) / 1e6:>9.1f} "
            f"{(span.end_ns - span.start_ns) / 1e6:>8.1f}  {events}"
        )
    return "\n".join(lines)
