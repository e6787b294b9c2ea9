"""Test helpers: polling with a deadline (never bare sleeps), event builders, table dumps."""

from __future__ import annotations

import datetime as dt
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select, update

from turnlog import polling
from turnlog.producers import SessionRecorder
from turnlog.resume_barrier import resume_source_for
from turnlog.schemas import SessionEnded, SessionStarted, TurnCompleted, TurnPartial, encode_event
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SourceMessage, SqlStore, open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.sinks.tables import metadata, sessions

T = TypeVar("T")
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def wait_until(probe: Callable[[], T], *, timeout: float, what: str, interval: float = 0.1) -> T:
    """:func:`turnlog.polling.wait_until` for tests: return ``probe``'s first truthy value; after
    ``timeout`` seconds raise AssertionError ("timed out after ... waiting for <what>"), a failed
    expectation of the test, which no ``except TimeoutError`` of the code under test can swallow."""
    try:
        return polling.wait_until(probe, timeout=timeout, what=what, interval=interval)
    except polling.WaitTimeoutError as e:
        raise AssertionError(str(e)) from e


class EventFactory:
    """Builds one session's events with explicit seq/epoch (for store and sequencer tests)."""

    def __init__(self, session_id: str | None = None) -> None:
        self.session_id = session_id or f"s-{uuid.uuid4().hex[:10]}"

    def _env(self, seq: int, epoch: int) -> dict[str, Any]:
        return dict(
            event_id=uuid.uuid4(), session_id=self.session_id, seq=seq, epoch=epoch,
            producer_id="test", emitted_at=BASE + dt.timedelta(seconds=seq),
        )

    def started(self, seq: int = 0, epoch: int = 0) -> SessionStarted:
        return SessionStarted(fleet="tests", agent_id="agent", started_at=BASE, **self._env(seq, epoch))

    def partial(self, seq: int, turn: int, text: str, epoch: int = 0, speaker: str = "A") -> TurnPartial:
        return TurnPartial(turn_index=turn, speaker=speaker, text=text, started_at=BASE + dt.timedelta(seconds=turn), **self._env(seq, epoch))

    def completed(
        self, seq: int, turn: int, text: str, epoch: int = 0, speaker: str = "A", tokens: int = 3, barged_in: bool = False
    ) -> TurnCompleted:
        return TurnCompleted(
            turn_index=turn, speaker=speaker, text=text, started_at=BASE + dt.timedelta(seconds=turn),
            ended_at=BASE + dt.timedelta(seconds=turn, milliseconds=900), input_tokens=tokens, output_tokens=1,
            barged_in=barged_in, **self._env(seq, epoch),
        )

    def ended(self, seq: int, epoch: int = 0, last_turn: int | None = None, seconds: float = 60.5) -> SessionEnded:
        return SessionEnded(ended_at=BASE + dt.timedelta(seconds=seconds), reason="done", last_turn_index=last_turn, **self._env(seq, epoch))


def messages(events: list[Any], *, topic: str = "t.transcript", partition: int = 0, first_offset: int = 0) -> list[SourceMessage]:
    return [SourceMessage(topic, partition, first_offset + i, encode_event(e)) for i, e in enumerate(events)]


@contextmanager
def sqlite_store(path: Path) -> Iterator[SqlStore]:
    """A migrated SQLite store in the file ``path``, its engine disposed at the end."""
    store = open_store(f"sqlite:///{path}")
    upgrade_to_head(store.engine)
    try:
        yield store
    finally:
        store.engine.dispose()


def dump_store(store: SqlStore, *, skip_columns: tuple[str, ...] = ("finalized_at",)) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, ordered by primary key (for identical-store comparisons)."""
    dump = {}
    with store.engine.connect() as conn:
        for table in metadata.sorted_tables:
            columns = [c for c in table.columns if c.name not in skip_columns]
            rows = conn.execute(select(*columns).order_by(*table.primary_key.columns)).all()
            dump[table.name] = [tuple(row) for row in rows]
    return dump


def store_content(store: SqlStore) -> dict[str, list[tuple[Any, ...]]]:
    """:func:`dump_store` without the sink's bookkeeping, for comparing stores written by
    different sink runs: no ``finalized_at`` or ``last_applied_at`` (the sink's clock), no fencing
    token (``owner_generation``), and no ``sink_offsets`` row that has consumed nothing (a claim of a
    partition that had no record)."""
    dump = dump_store(store, skip_columns=("finalized_at", "last_applied_at", "owner_generation"))
    dump["sink_offsets"] = [row for row in dump["sink_offsets"] if row[-1] != 0]  # (group, topic, partition, next_offset)
    return dump


def fenced_batches(metrics_port: int) -> float:
    """``turnlog_sink_fenced_batches_total`` scraped from a sink's metrics endpoint (``TURNLOG_METRICS_PORT``)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:  # noqa: S310 (local)
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "turnlog_sink_fenced_batches":
            return sum(sample.value for sample in family.samples if sample.name.endswith("_total"))
    return 0.0


def unfinalize(store: SqlStore, session_id: str) -> None:
    """Leave ``session_id`` as a sink that did not finalize in its batch left it:
    ended and complete, no aggregates (the finalizer's sweep is for such rows)."""
    with store.engine.begin() as conn:
        conn.execute(
            update(sessions)
            .where(sessions.c.id == session_id, sessions.c.status == "finalized")
            .values(
                status="ended", turn_count=None, interrupted_turn_count=None, duration_seconds=None,
                input_tokens=None, output_tokens=None, finalized_at=None,
            )
        )


def free_port() -> int:
    """A TCP port nothing listens on right now (for a service under test)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@partial(dataclass, frozen=True)
class SseEvent:
    """One Server-Sent Event as received: ``id``, ``event`` (type) and ``data``."""

    id: str | None
    event: str
    data: str


async def sse_events(lines: Any) -> Any:
    """Parse an async iterator of text lines (``httpx.Response.aiter_lines()``) into :class:`SseEvent`s."""
    event_id, kind, data = None, "message", []
    async for line in lines:
        if line == "":
            if data:
                yield SseEvent(event_id, kind, "\n".join(data))
            event_id, kind, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            event_id = value
        elif field == "event":
            kind = value
        elif field == "data":
            data.append(value)


#: Set by ``deploy/dev.sh test`` (which installs every adapter extra): a framework that
#: cannot be imported there fails its tests instead of skipping them without a word.
REQUIRE_EXTRAS_ENV = "TURNLOG_TEST_REQUIRE_EXTRAS"


def require_extra(module: str, extra: str) -> None:
    """Skip the calling test module when ``module`` cannot be imported (the optional
    extra ``extra`` is not installed), unless ``TURNLOG_TEST_REQUIRE_EXTRAS=1``: then
    raise, so a missing framework is an error, not a quiet skip.

    Raises:
        ImportError: the module is missing and extras are required.
    """
    import importlib
    import os

    import pytest

    try:
        importlib.import_module(module)
    except ImportError as e:
        if os.environ.get(REQUIRE_EXTRAS_ENV) == "1":
            raise ImportError(f"{module} is not importable ({e}); install it: pip install -e '.[{extra}]'") from e
        pytest.skip(f"{module} is not importable: the optional extra turnlog[{extra}]", allow_module_level=True)


def watermark_offsets(consumer, topic: str, partition: int, timeout: float = 30.0) -> tuple[int, int]:
    """``(low, high)`` of ``topic``'s ``partition``, asked again while the broker answers with a
    retriable error (a topic just created may have no leader yet: NOT_LEADER_FOR_PARTITION)."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    not_yet = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        except KafkaException as e:
            error = e.args[0]
            if not (error.retriable() or error.code() in not_yet) or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def create_topic(admin, topic, timeout: float = 30.0) -> str:
    """Create ``topic`` (a confluent-kafka ``NewTopic``) and return its name once the broker
    describes its configs. CreateTopics answers when the controller has committed the topic; a
    broker applies that metadata a moment later and until then answers UNKNOWN_TOPIC_OR_PART."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    admin.create_topics([topic])[topic.topic].result(timeout=timeout)

    def described() -> bool:
        (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic.topic)],
                                           request_timeout=10).values()
        try:
            future.result(timeout=timeout)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            return False
        return True

    wait_until(described, timeout=timeout, what=f"the broker to describe topic {topic.topic}", interval=0.2)
    return topic.topic


def read_partition(bootstrap_servers: str, topic: str, partition: int) -> list[Any]:
    """Every committed record (confluent-kafka ``Message``) of ``topic``'s ``partition``, from its low
    watermark to the high watermark taken at the call (a transaction's markers, which no consumer is
    given, may lie between the last record and it).

    Raises:
        AssertionError: the partition was not read up to that watermark within 30 s.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    # The end of the partition is an event (PARTITION_EOF), not a position: no record follows a
    # transaction's markers, so the position can stay short of the high watermark until more is written.
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"test-reader-{uuid.uuid4()}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    found: list[Any] = []
    try:
        low, high = watermark_offsets(consumer, topic, partition)
        if high <= low:
            return found
        consumer.assign([TopicPartition(topic, partition, low)])
        deadline = time.monotonic() + 30
        while consumer.position([TopicPartition(topic, partition)])[0].offset < high:
            assert time.monotonic() < deadline, f"{topic}[{partition}] not read up to offset {high}"
            record = consumer.poll(0.5)
            if record is None:
                continue
            if record.error():
                if record.error().code() == KafkaError._PARTITION_EOF and record.offset() >= high:
                    break
                continue
            found.append(record)
    finally:
        consumer.close()
    return found


def partition_records(
    bootstrap_servers: str, topic: str, partition: int
) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    """``(key, value, headers)`` of every committed record of ``topic``'s ``partition``
    (:func:`read_partition`)."""
    return [(m.key(), m.value(), m.headers() or []) for m in read_partition(bootstrap_servers, topic, partition)]


def recorder_for(settings: TurnlogSettings, **kwargs: Any) -> SessionRecorder:
    """A :class:`SessionRecorder` that resumes as a host holding the store does: through the API
    when ``settings.api_url`` is set, else by running the barrier over the store
    (:func:`~turnlog.resume_barrier.resume_source_for`)."""
    return SessionRecorder(settings, resume_source=resume_source_for(settings), **kwargs)


# -- fleet keys, as a deployment has them ---------------------------------------------------
#: The fleets the integration fixtures (``tests/integration/conftest.py``, ``isolated_settings``)
#: give a record signing key, as a deployment gives each of its fleets one: every fleet a test
#: records or writes raw events as.
FIXTURE_FLEETS = ("tests", "alpha", "beta", "fleet-a", "fleet-b", "fleet-c", "fleet-d", "fleet-page", "fleet-ops",
                  "ops", "calls", "brief", "support", "demo", "a", "b", "f")
#: ``TURNLOG_FLEET_KEYS`` of the fixtures: one distinct key per fleet, at least 32 bytes.
FIXTURE_FLEET_KEYS = {fleet: f"fixture-key-{fleet}-" + "k" * 32 for fleet in FIXTURE_FLEETS}
#: ``TURNLOG_EPOCH_GRANT_KEY`` of the fixtures.
FIXTURE_GRANT_KEY = "fixture-grant-issuer-" + "g" * 32


def provenance(settings: TurnlogSettings, key: bytes, value: bytes, *, fleet: str = "tests",
               session_id: str | None = None, epoch: int = 0) -> list[tuple[str, bytes]] | None:
    """The provenance headers a raw record of ``<prefix>.events`` needs to be admitted as fleet
    ``fleet``'s, as its recorder would write it: signed with the fleet's key in ``settings`` and,
    for ``epoch`` above 0, with an epoch grant for ``session_id`` (any seq) issued with
    ``settings.epoch_grant_key``. None in open mode (no fleet keys): the record goes unsigned."""
    from turnlog.signing import EpochGrant, RecordSigner, issue_epoch_grant

    if not settings.fleet_keys:
        return None
    grant = None
    if epoch > 0:
        assert settings.epoch_grant_key is not None and session_id is not None, "a resumed epoch needs a grant"
        grant = issue_epoch_grant(settings.epoch_grant_key.get_secret_value(),
                                  EpochGrant(fleet, session_id, epoch, 0))
    return list(RecordSigner(settings.fleet_key_rings()).headers(fleet, key, value, grant))


def signed_event(settings: TurnlogSettings, event: Any, *, fleet: str | None = None) -> tuple[bytes, bytes, Any]:
    """``(key, value, headers)`` of ``event`` as a raw record of ``<prefix>.events``, signed as its
    fleet's (:func:`provenance`): a ``session.started``'s own fleet, else ``fleet`` (default ``tests``,
    the fleet of :class:`EventFactory`'s starts)."""
    key, value = event.session_id.encode(), encode_event(event)
    writer = event.fleet if isinstance(event, SessionStarted) else fleet or "tests"
    return key, value, provenance(settings, key, value, fleet=writer, session_id=event.session_id, epoch=event.epoch)
