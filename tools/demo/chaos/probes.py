"""The chaos run's probes: does the broker or the database answer, has a replacement joined its
consumer group, how far the topics, the sink and the stored turns have come; and
:func:`_held_within`, which polls one of them until it holds."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy import select

from turnlog import kafka
from turnlog.polling import WaitTimeoutError, wait_until
from turnlog.schemas import TurnStatus
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore, StoreUnavailableError
from turnlog.sinks.driver_errors import store_errors
from turnlog.sinks.offsets import stored_group_offsets
from turnlog.sinks.tables import transcript_turns
from turnlog.tools.demo.group_probe import GroupProbe

logger = logging.getLogger(__name__)

#: The probes' clients keep quiet: a broker that does not answer is an answer here.
_QUIET = {"log_level": 0}


def _held_within(probe: Callable[[], object], timeout: float, what: str, *, every: float = 0.1) -> bool:
    """Poll ``probe`` every ``every`` seconds: True once it returns a truthy value, False (logged,
    naming ``what``) after ``timeout`` seconds. The run goes on either way (a False is recorded as
    a component not recovered where it matters)."""
    try:
        wait_until(probe, timeout=timeout, what=what, interval=every)
    except WaitTimeoutError as e:
        logger.error("%s", e)
        return False
    return True


def _broker_answers(settings: TurnlogSettings) -> bool:
    return kafka.broker_answers(settings, 2.0, quiet=True)


def _group_rejoined(probe: GroupProbe, group: str, before: frozenset[str]) -> bool:
    """A member the group did not have before the kill has joined, and the group is stable."""
    stable, members = probe.members(group)
    return stable and bool(members - before)


def _watermarks(settings: TurnlogSettings, topic: str, *, committed_records: bool = False) -> int:
    """Records in ``topic`` (the sum of its end offsets; with ``committed_records``, of the offsets
    after each partition's last committed record, where a consumer that read everything stands:
    the transcript is written in transactions), or -1 if the broker did not answer within 5 s."""
    try:
        with kafka.OffsetReader(settings, **_QUIET) as offsets:
            lookup = offsets.record_ends if committed_records else offsets.end_offsets
            ends = lookup(topic, range(settings.partitions), deadline=time.monotonic() + 5.0)
    except kafka.BrokerError:  # the broker may be restarting: "no progress yet"
        return -1
    return sum(ends.values())


def _complete_turns(store: SqlStore, session_ids: list[str]) -> list[tuple[str, int]]:
    """(session key, turn index) of every turn of the sessions keyed ``session_ids`` stored complete.

    Raises:
        StoreUnavailableError: the store did not answer.
    """
    with store_errors(), store.engine.connect() as conn:
        rows = conn.execute(
            select(transcript_turns.c.session_id, transcript_turns.c.turn_index)
            .where(transcript_turns.c.session_id.in_(session_ids), transcript_turns.c.status == TurnStatus.COMPLETE)
        ).all()
    return [(session_id, turn_index) for session_id, turn_index in rows]


def _sink_progress(store: SqlStore, settings: TurnlogSettings) -> int:
    """The sink's stored offsets summed (its group's ``sink_offsets`` rows, on the topics it consumes),
    or -1 if the store did not answer."""
    topics = settings.topics
    try:
        stored = stored_group_offsets(store, settings.sink_group, (topics.transcript, topics.erasures))
    except StoreUnavailableError:
        return -1
    return sum(stored.values())


def _sink_moved(store: SqlStore, settings: TurnlogSettings, before: int) -> bool:
    """The sink stored something after ``before`` (its summed offsets), or has nothing left to store."""
    pending = _watermarks(settings, settings.topics.transcript, committed_records=True)
    progress = _sink_progress(store, settings)
    return pending >= 0 and progress >= 0 and progress > min(before, pending - 1)
