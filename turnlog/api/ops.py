"""The operations page's figures (``GET /api/ops``; the page is ``/ops``).

One :class:`OpsBoard` per API process reads three sources, each on a thread of
its own and within ``OPS_SOURCE_TIMEOUT_SECONDS``:

- **lag** (a :class:`LagReader`, ``turnlog.kafka.lag.LagMonitor`` over the
  pipeline's consumer groups): records and seconds behind per group and
  partition; throughput is derived from successive reads' end offsets.
- **store**: sessions open (``turnlog.sinks.reads.count_open_sessions``).
- **prometheus** (:class:`PrometheusReader`, when ``ops_prometheus_url`` is
  set): turn-to-store p50/p99, DLQ records by stage and reason, degraded
  recorders, spool fullness. The queries are fixed here; a client never
  sends PromQL.

Load is the board's, not the clients': each source is read at most once per
``ops_refresh_seconds`` whatever the number of clients, and a request is
answered at once with each source's last outcome (it waits only for a
source's very first read, until that read's deadline). A source that hangs
keeps its one thread and is reported ``timeout`` until it returns: it is
never asked again meanwhile, so a hung broker, store or Prometheus costs one
thread each, delays no other figure, and never blocks the event loop.

Every figure carries a ``state``: ``ok``, ``not_configured``, ``timeout``,
``unavailable`` (the source answered with an error or not at all) or
``pending`` (no read finished yet). Errors are logged by class, never with
content; the JSON holds no session id and is bounded in rows
(``MAX_LAG_ROWS``, ``MAX_PROMETHEUS_ROWS``) and label lengths.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import httpx

from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import SqlStore

__all__ = [
    "OpsBoard",
    "LagReader",
    "PartitionLagLike",
    "PrometheusReader",
    "PrometheusFigures",
    "PROMETHEUS_QUERIES",
    "OPS_SOURCE_TIMEOUT_SECONDS",
    "MAX_LAG_ROWS",
    "MAX_PROMETHEUS_ROWS",
    "pipeline_lag_reader",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Longest one read of a source (lag, store, Prometheus) may take (seconds); a request waits at
#: most about this long, and only for a source's first read.
OPS_SOURCE_TIMEOUT_SECONDS = 3.0
#: How long past its own deadline a source's read may take to return before it counts as ``timeout``
#: (its client's last round trip, closing a fetch).
OPS_SOURCE_GRACE_SECONDS = 0.5
#: Most lag rows (group x topic x partition) one answer holds; the rest are counted as ``omitted``.
MAX_LAG_ROWS = 1024
#: Most rows one Prometheus figure (DLQ reasons, degraded recorders, spool fullness) holds.
MAX_PROMETHEUS_ROWS = 50
#: Most bytes read of one Prometheus answer: a larger one is refused (``unavailable``).
MAX_PROMETHEUS_ANSWER_BYTES = 256 * 1024
#: Longest label value (instance, stage, reason) passed on; longer ones are cut.
MAX_LABEL_CHARS = 120
#: The window of the rates and percentiles asked of Prometheus.
PROMETHEUS_WINDOW = "5m"

#: The fixed PromQL of each Prometheus figure (metric names: turnlog/metrics.py).
PROMETHEUS_QUERIES: dict[str, str] = {
    "turn_to_store_p50": "histogram_quantile(0.5, sum by (le) "
    f"(rate(turnlog_sink_turn_to_store_seconds_bucket[{PROMETHEUS_WINDOW}])))",
    "turn_to_store_p99": "histogram_quantile(0.99, sum by (le) "
    f"(rate(turnlog_sink_turn_to_store_seconds_bucket[{PROMETHEUS_WINDOW}])))",
    "turns_stored_per_second": f"sum(rate(turnlog_sink_turn_to_store_seconds_count[{PROMETHEUS_WINDOW}]))",
    "dlq_last_hour": f"topk({MAX_PROMETHEUS_ROWS}, sum by (stage, reason) (increase(turnlog_dlq_total[1h])))",
    "degraded_count": "count(turnlog_recorder_degraded == 1)",
    "degraded_instances": f"topk({MAX_PROMETHEUS_ROWS}, turnlog_recorder_degraded == 1)",
    "spool_fullness": f"topk({MAX_PROMETHEUS_ROWS}, turnlog_spool_bytes / on (instance, job) "
    "(turnlog_spool_max_bytes > 0))",
}


class PartitionLagLike(Protocol):
    """One partition's lag for one group (``turnlog.kafka.lag.PartitionLag``)."""

    @property
    def group(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def committed(self) -> int | None: ...
    @property
    def end(self) -> int: ...
    @property
    def records(self) -> int: ...
    @property
    def seconds(self) -> float: ...


class LagReader(Protocol):
    """What the board needs of ``turnlog.kafka.lag.LagMonitor`` (tests pass their own)."""

    def read(self, timeout: float) -> Sequence[PartitionLagLike]: ...

    def close(self) -> None: ...

    #: the groups the last read could not get the offsets of (left out of its answer)
    unread_groups: tuple[str, ...]


def pipeline_lag_reader(settings: TurnlogSettings, store: SqlStore) -> LagReader:
    """A ``LagMonitor`` over the pipeline's consumer groups; the sink's and the analytics
    projection's offsets are read from ``store`` (their ``sink_offsets`` rows)."""
    from turnlog.kafka.lag import LagMonitor, pipeline_groups
    from turnlog.sinks.offsets import stored_group_offsets

    def stored(group: str, topics: Sequence[str]) -> Any:
        return stored_group_offsets(store, group, topics)

    return LagMonitor(settings, committed_sources=pipeline_groups(settings, stored_offsets=stored),
                      refresh_seconds=settings.ops_refresh_seconds)


@dataclass(frozen=True)
class PrometheusFigures:
    """One read of Prometheus: each figure None when Prometheus has no data for it.

    ``turn_to_store_p50``/``p99`` and ``turns_stored_per_second`` over the last
    ``PROMETHEUS_WINDOW``; ``dlq`` rows ``{"stage", "reason", "records"}`` (last hour);
    ``degraded_count`` and ``degraded_instances`` (``{"instance", "job"}``);
    ``spool`` rows ``{"instance", "job", "fullness"}`` (spool bytes over its capacity, 0..1).
    """

    turn_to_store_p50: float | None
    turn_to_store_p99: float | None
    turns_stored_per_second: float | None
    dlq: list[dict[str, Any]]
    degraded_count: int
    degraded_instances: list[dict[str, str]]
    spool: list[dict[str, Any]]


class PrometheusUnavailable(Exception):
    """Prometheus did not answer, or answered something that is not a query result."""


class PrometheusReader:
    """The fixed :data:`PROMETHEUS_QUERIES` against a Prometheus server's HTTP API
    (``GET <url>/api/v1/query``), all within one deadline.

    Blocking: call it from a thread of its own.
    """

    def __init__(self, url: str, *, transport: httpx.BaseTransport | None = None) -> None:
        self._client = httpx.Client(base_url=url.rstrip("/"), transport=transport, follow_redirects=False,
                                    headers={"Accept": "application/json"})

    def read(self, timeout: float) -> PrometheusFigures:
        """Every figure, within ``timeout`` seconds.

        Raises:
            PrometheusUnavailable: a query failed (transport, HTTP status, an answer that is not
                a vector, or one larger than ``MAX_PROMETHEUS_ANSWER_BYTES``).
            TimeoutError: the deadline came first.
        """
        deadline = time.monotonic() + timeout
        answers = {name: self._query(query, deadline) for name, query in PROMETHEUS_QUERIES.items()}
        degraded = answers["degraded_count"]
        return PrometheusFigures(
            turn_to_store_p50=_single(answers["turn_to_store_p50"]),
            turn_to_store_p99=_single(answers["turn_to_store_p99"]),
            turns_stored_per_second=_single(answers["turns_stored_per_second"]),
            dlq=sorted(
                ({"stage": _label(m, "stage"), "reason": _label(m, "reason"), "records": v}
                 for m, v in answers["dlq_last_hour"] if v is not None and v > 0),
                key=lambda row: (-row["records"], row["stage"], row["reason"]),
            ),
            degraded_count=int(_single(degraded) or 0),
            degraded_instances=sorted(
                ({"instance": _label(m, "instance"), "job": _label(m, "job")}
                 for m, _ in answers["degraded_instances"]),
                key=lambda row: (row["instance"], row["job"]),
            ),
            spool=sorted(
                ({"instance": _label(m, "instance"), "job": _label(m, "job"), "fullness": v}
                 for m, v in answers["spool_fullness"] if v is not None),
                key=lambda row: -row["fullness"],
            ),
        )

    def close(self) -> None:
        self._client.close()

    def _query(self, query: str, deadline: float) -> list[tuple[dict[str, Any], float | None]]:
        """``[(labels, value)]`` of an instant vector query (value None if not finite)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the Prometheus deadline passed")
        try:
            with self._client.stream("GET", "/api/v1/query", params={"query": query},
                                     timeout=httpx.Timeout(left)) as response:
                if response.status_code != 200:
                    raise PrometheusUnavailable(f"HTTP {response.status_code}")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_PROMETHEUS_ANSWER_BYTES:
                        raise PrometheusUnavailable(f"an answer over {MAX_PROMETHEUS_ANSWER_BYTES} bytes")
                    if time.monotonic() > deadline:
                        raise TimeoutError("the Prometheus deadline passed")
        except httpx.TimeoutException as e:
            raise TimeoutError("Prometheus did not answer in time") from e
        except httpx.HTTPError as e:
            raise PrometheusUnavailable(type(e).__name__) from e
        try:
            answer = json.loads(body)
            data = answer["data"]
            if answer.get("status") != "success" or data.get("resultType") != "vector":
                raise PrometheusUnavailable("not a vector result")
            rows = []
            for item in data["result"][:MAX_PROMETHEUS_ROWS]:
                value = float(item["value"][1])
                rows.append((dict(item.get("metric") or {}), value if math.isfinite(value) else None))
            return rows
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            raise PrometheusUnavailable(f"a malformed answer ({type(e).__name__})") from e


def _single(rows: list[tuple[dict[str, Any], float | None]]) -> float | None:
    return rows[0][1] if rows else None


def _label(labels: dict[str, Any], name: str) -> str:
    value = labels.get(name)
    return value[:MAX_LABEL_CHARS] if isinstance(value, str) else ""


class _Source(Generic[T]):
    """One source's reads, on a thread of its own, at most once per ``interval``: a read is started
    by a request that finds the last one older than that and none running, and its outcome is kept
    for every later request. A read running longer than ``timeout`` (plus the grace) shows as
    ``timeout``, and no other read of this source starts until it returns."""

    def __init__(self, name: str, read: Callable[[float], T], *, interval: float, timeout: float) -> None:
        self.name = name
        self._read = read
        self._interval = interval
        self._timeout = timeout
        self._closed = False
        self._lock = threading.RLock()  # a read done at once runs its callback inside poke()
        self._running: Future[T] | None = None
        self._started_at = -math.inf  # time.monotonic() when the running (or last) read started
        self._finished_at = -math.inf  # ... when the last read finished
        self._outcome: tuple[str, Any] = ("pending", None)
        #: Reads started (tests and the ops bench read it).
        self.reads = 0

    def poke(self, now: float) -> tuple[Future[T], float] | None:
        """Start a read if one is due; returns ``(the running read, when it times out)`` while this
        source has no outcome yet (a request may wait for its first one until then), else None."""
        with self._lock:
            running = self._running is not None and not self._running.done()
            if not running and now - self._finished_at >= self._interval:
                if self._closed:
                    return None
                self._running = self._start_read()
                self._started_at = now
                self.reads += 1
                self._running.add_done_callback(self._finished)
                running = True
            if running and self._outcome[0] == "pending" and self._running is not None:
                return self._running, self._started_at + self._timeout + OPS_SOURCE_GRACE_SECONDS
            return None

    def outcome(self, now: float) -> tuple[str, Any, float | None]:
        """``(state, value, age in seconds of the read it comes from)``."""
        with self._lock:
            running = self._running is not None and not self._running.done()
            if running and now - self._started_at > self._timeout + OPS_SOURCE_GRACE_SECONDS:
                return "timeout", None, None
            state, value = self._outcome
            age = now - self._finished_at if math.isfinite(self._finished_at) else None
            return state, value, age

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _start_read(self) -> Future[T]:
        """One read on a daemon thread of its own (at most one runs: :meth:`poke`). Not a
        ``concurrent.futures`` worker, which Python joins at exit: a store that never answers
        would keep the API from exiting."""
        future: Future[T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self._read(self._timeout))
            except BaseException as e:  # the read's outcome (_finished), never this thread's failure
                future.set_exception(e)

        threading.Thread(target=run, name=f"turnlog-ops-{self.name}", daemon=True).start()
        return future

    def _finished(self, future: Future[T]) -> None:
        outcome: tuple[str, Any]
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            outcome = ("ok", future.result())
        elif isinstance(error, TimeoutError):
            logger.warning("operations page: the %s source did not answer in time", self.name)
            outcome = ("timeout", None)
        else:
            logger.warning("operations page: the %s source is unavailable (%s)", self.name, type(error).__name__)
            outcome = ("unavailable", None)
        with self._lock:
            self._outcome, self._finished_at = outcome, time.monotonic()


class OpsBoard:
    """The figures of ``GET /api/ops``: each source read at most once per ``refresh_seconds``
    whatever the number of requests, on its own thread, within ``source_timeout`` seconds.

    A request never waits for a read except a source's very first one (until that read's
    deadline): afterwards it is answered at once with each source's last outcome, so a slow
    source delays neither the other figures nor the answer. A read running past its deadline
    makes its figure ``timeout`` (its rows are dropped, not shown stale).

    ``lag``: a factory of the lag reader, called on the lag source's thread at its first
    read (so a broker that hangs never holds up the API's start); None: lag and throughput
    are ``not_configured``. ``prometheus``: None when ``ops_prometheus_url`` is unset.
    ``store``: None leaves sessions open ``not_configured``.
    """

    def __init__(
        self,
        *,
        lag: Callable[[], LagReader] | None,
        store: SqlStore | None,
        prometheus: PrometheusReader | None,
        refresh_seconds: float,
        source_timeout: float = OPS_SOURCE_TIMEOUT_SECONDS,
    ) -> None:
        self._refresh_seconds = refresh_seconds
        self._lag_factory = lag
        self._lag_reader: LagReader | None = None
        self._store = store
        self._prometheus = prometheus
        self._ends: tuple[float, dict[str, int]] | None = None  # the previous lag read's end offsets by topic
        self.sources: dict[str, _Source[Any]] = {}
        for name, read, wanted in (("lag", self._read_lag, lag), ("store", self._read_sessions, store),
                                   ("prometheus", prometheus.read if prometheus else None, prometheus)):
            if wanted is not None and read is not None:
                self.sources[name] = _Source(name, read, interval=refresh_seconds, timeout=source_timeout)

    @classmethod
    def for_settings(cls, settings: TurnlogSettings, store: SqlStore) -> OpsBoard:
        """The board of ``turnlog api``: the pipeline's lag, ``store``, and Prometheus when configured."""
        url = settings.ops_prometheus_url
        return cls(
            lag=lambda: pipeline_lag_reader(settings, store),
            store=store,
            prometheus=PrometheusReader(url) if url else None,
            refresh_seconds=settings.ops_refresh_seconds,
        )

    async def figures(self) -> dict[str, Any]:
        """Every figure as its source last gave it (reads started where due); waits only for a
        source's first read, at most until that read's deadline."""
        now = time.monotonic()
        first_reads = {name: poked for name, source in self.sources.items() if (poked := source.poke(now)) is not None}
        if first_reads:
            deadline = max(until for _, until in first_reads.values())
            waiting = {asyncio.wrap_future(future) for future, _ in first_reads.values()}
            for awaitable in waiting:  # its outcome is the source's; read here so none is reported unread
                awaitable.add_done_callback(lambda f: f.cancelled() or f.exception())
            await asyncio.wait(waiting, timeout=max(0.0, deadline - time.monotonic()))
        now = time.monotonic()
        outcomes = {name: source.outcome(now) for name, source in self.sources.items()}
        for name in first_reads:  # a first read not done by its deadline (the wait may wake a tick early)
            if outcomes[name][0] == "pending":
                outcomes[name] = ("timeout", None, None)
        return {
            "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            "refresh_seconds": self._refresh_seconds,
            **self._lag_figures(outcomes.get("lag")),
            "sessions_open": self._sessions_figure(outcomes.get("store")),
            "prometheus": self._prometheus_figures(outcomes.get("prometheus")),
        }

    def close(self) -> None:
        """Stop reading; a read still running finishes on its own thread, unwaited."""
        for source in self.sources.values():
            source.close()
        if self._prometheus is not None:
            self._prometheus.close()
        if self._lag_reader is not None:
            try:
                self._lag_reader.close()
            except Exception as e:  # closing a reader whose broker is away
                logger.warning("the operations page's lag reader did not close cleanly (%s)", type(e).__name__)

    # -- the sources' reads (each on its own thread) -----------------------------------------

    def _read_lag(self, timeout: float) -> dict[str, Any]:
        """The lag rows and the throughput since the previous read."""
        if self._lag_reader is None:
            assert self._lag_factory is not None
            self._lag_reader = self._lag_factory()
        lags = self._lag_reader.read(timeout)
        rows = [
            {"group": lag.group, "topic": lag.topic, "partition": lag.partition, "committed": lag.committed,
             "end": lag.end, "records": lag.records,
             "seconds": round(lag.seconds, 3) if math.isfinite(lag.seconds) else None}
            for lag in lags[:MAX_LAG_ROWS]
        ]
        unread = list(getattr(self._lag_reader, "unread_groups", ()))[:MAX_LAG_ROWS]
        return {"partitions": rows, "omitted": max(0, len(lags) - MAX_LAG_ROWS), "topics": self._throughput(lags),
                "unread_groups": unread}

    def _throughput(self, lags: Sequence[PartitionLagLike]) -> list[dict[str, Any]]:
        """Offsets per second of each topic since the previous read: its partitions' end
        offsets summed (each partition once, whatever the groups reading it)."""
        ends: dict[tuple[str, int], int] = {}
        for lag in lags:
            ends[(lag.topic, lag.partition)] = max(lag.end, ends.get((lag.topic, lag.partition), 0))
        totals: dict[str, int] = {}
        for (topic, _), end in ends.items():
            totals[topic] = totals.get(topic, 0) + end
        now = time.monotonic()
        previous, self._ends = self._ends, (now, totals)
        topics = []
        for topic, total in sorted(totals.items()):
            rate = None
            if previous is not None and topic in previous[1] and now > previous[0] and total >= previous[1][topic]:
                rate = round((total - previous[1][topic]) / (now - previous[0]), 3)
            topics.append({"topic": topic, "end_offsets": total, "records_per_second": rate})
        return topics

    def _read_sessions(self, _timeout: float) -> int:
        assert self._store is not None
        with self._store.reading() as reads:
            return reads.open_session_count()

    # -- the answer ---------------------------------------------------------------------------

    @staticmethod
    def _lag_figures(outcome: tuple[str, Any, float | None] | None) -> dict[str, Any]:
        if outcome is None:
            return {"lag": {"state": "not_configured", "partitions": [], "omitted": 0, "age_seconds": None},
                    "throughput": {"state": "not_configured", "topics": []}}
        state, value, age = outcome
        if state == "ok" and value["unread_groups"] and not value["partitions"]:
            state = "unavailable"  # no group's offsets could be read (a broker or store outage): not "no lag"
        if state != "ok":
            return {"lag": {"state": state, "partitions": [], "omitted": 0, "age_seconds": None,
                            "unread_groups": value["unread_groups"] if value else []},
                    "throughput": {"state": state, "topics": []}}
        return {"lag": {"state": "ok", "partitions": value["partitions"], "omitted": value["omitted"],
                        "age_seconds": _age(age), "unread_groups": value["unread_groups"]},
                "throughput": {"state": "ok", "topics": value["topics"]}}

    @staticmethod
    def _sessions_figure(outcome: tuple[str, Any, float | None] | None) -> dict[str, Any]:
        if outcome is None:
            return {"state": "not_configured", "count": None}
        state, count, _ = outcome
        return {"state": state, "count": count if state == "ok" else None}

    @staticmethod
    def _prometheus_figures(outcome: tuple[str, Any, float | None] | None) -> dict[str, Any]:
        if outcome is None:
            return {"state": "not_configured"}
        state, figures, age = outcome
        if state != "ok":
            return {"state": state}
        return {
            "state": "ok",
            "age_seconds": _age(age),
            "window": PROMETHEUS_WINDOW,
            "turn_to_store_seconds": {"p50": figures.turn_to_store_p50, "p99": figures.turn_to_store_p99},
            "turns_stored_per_second": figures.turns_stored_per_second,
            "dlq_last_hour": figures.dlq,
            "degraded_recorders": {"count": figures.degraded_count, "instances": figures.degraded_instances},
            "spool_fullness": figures.spool,
        }


def _age(seconds: float | None) -> float | None:
    return round(seconds, 3) if seconds is not None else None
