"""Whether the log keeps content longer than the store's retention policy or the erasure deadline.

docs/design.md, "Encryption and erasure": every sealed event carries its epoch's
wrapped data key, so a session's content stays readable (to a holder of the
KEK) for as long as any topic keeps its records. The store forgets a session
when the retention sweep (``TURNLOG_RETENTION_DAYS``, per fleet
``TURNLOG_RETENTION_DAYS_BY_FLEET``) or a request forgets it; the log forgets
it only when ``retention.ms`` of ``<prefix>.events``, ``.transcript`` and
``.dlq`` runs out. :func:`log_outlives_policy` compares the three, as the
settings ask and (when given) as the broker holds them, with the shortest
retention policy and with ``TURNLOG_ERASURE_DEADLINE_DAYS``, and returns a
typed finding for each that outlives them (``-1``, kept forever, always does).
The sink logs each as a warning at start; ``turnlog topics check`` prints them.

Kafka deletes a whole segment once its newest record is older than
``retention.ms``, so a record can outlive it by up to the topic's
``segment.ms``: turnlog sets it to at most a day on these topics
(``topic_specs.MAX_SEGMENT_MS``; the broker's own default is 7 days). The
findings compare ``retention.ms`` alone, the bound an operator sets; the day
of slack is documented with the erasure deadline.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from turnlog.settings import TurnlogSettings

__all__ = ["LogOutlivesPolicy", "PolicyLimit", "log_outlives_policy", "retention_policy_ms", "MS_PER_DAY"]

MS_PER_DAY = 24 * 3600 * 1000

#: Where a retention.ms was read: the settings (what ``turnlog topics create``/``check`` set) or the broker.
RetentionSource = Literal["settings", "broker"]


class PolicyLimit(enum.Enum):
    """Which limit a topic's retention outlives (the shorter one, when it outlives both)."""

    RETENTION_POLICY = "the store's retention policy"
    ERASURE_DEADLINE = "the erasure deadline"


@dataclass(frozen=True, slots=True)
class LogOutlivesPolicy:
    """One topic whose ``retention.ms`` is longer than ``limit_ms``, or -1 (forever).

    ``setting`` is the settings field of that retention (``events_retention_ms``, ...);
    ``source`` says whether ``retention_ms`` is the settings' value or the broker's
    (which ``turnlog topics check`` sets to the settings' value); ``limit`` is the
    limit it outlives, ``limit_ms`` that limit in milliseconds (the value to set)."""

    topic: str
    setting: str
    source: RetentionSource
    retention_ms: int
    limit: PolicyLimit
    limit_ms: int

    @property
    def forever(self) -> bool:
        """The topic keeps its records forever (``retention.ms=-1``)."""
        return self.retention_ms < 0

    @property
    def environment_variable(self) -> str:
        """The environment variable that sets this topic's retention (``TURNLOG_EVENTS_RETENTION_MS``)."""
        return f"TURNLOG_{self.setting.upper()}"

    @property
    def fix(self) -> str:
        """What an operator does about it."""
        if self.source == "broker":
            return (f"run `turnlog topics check` (it sets retention.ms to {self.environment_variable}), with "
                    f"{self.environment_variable} at most {self.limit_ms}")
        return f"set {self.environment_variable}={self.limit_ms} (or less) and run `turnlog topics check`"

    def __str__(self) -> str:
        kept = "forever (retention.ms=-1)" if self.forever else f"{self.retention_ms} ms"
        return (f"{self.topic} keeps records {kept} ({self.source}), longer than {self.limit.value} "
                f"({self.limit_ms} ms): {self.fix}")


def retention_policy_ms(settings: TurnlogSettings) -> int | None:
    """The shortest retention policy in milliseconds: the smallest of ``retention_days`` and the
    values of ``retention_days_by_fleet``; None when neither is set (sessions are kept until
    forgotten on request)."""
    days = [*([] if settings.retention_days is None else [settings.retention_days]),
            *settings.retention_days_by_fleet.values()]
    return int(min(days) * MS_PER_DAY) if days else None


def log_outlives_policy(
    settings: TurnlogSettings, broker_retention_ms: Mapping[str, int] | None = None
) -> list[LogOutlivesPolicy]:
    """The findings (module docstring) for ``<prefix>.events``, ``.transcript`` and ``.dlq``, in
    that order: first from the settings, then from ``broker_retention_ms`` (topic name to the
    broker's ``retention.ms``; topics it lacks are not compared, nor a broker value equal to the
    settings' one, which the settings' finding already covers). Pure: nothing is asked of a broker.

    A topic outlives the policy when its retention is -1 or longer than the smaller of
    :func:`retention_policy_ms` (if set) and ``erasure_deadline_days``."""
    deadline_ms = int(settings.erasure_deadline_days * MS_PER_DAY)
    policy_ms = retention_policy_ms(settings)
    if policy_ms is not None and policy_ms <= deadline_ms:
        limit, limit_ms = PolicyLimit.RETENTION_POLICY, policy_ms
    else:
        limit, limit_ms = PolicyLimit.ERASURE_DEADLINE, deadline_ms
    topics = settings.topics
    configured = {
        topics.events: ("events_retention_ms", settings.events_retention_ms),
        topics.transcript: ("transcript_retention_ms", settings.transcript_retention_ms),
        topics.dlq: ("dlq_retention_ms", settings.dlq_retention_ms),
    }
    observed: list[tuple[str, str, RetentionSource, int]] = [
        (topic, setting, "settings", retention_ms) for topic, (setting, retention_ms) in configured.items()
    ]
    for topic, (setting, retention_ms) in configured.items():
        found = (broker_retention_ms or {}).get(topic)
        if found is not None and found != retention_ms:
            observed.append((topic, setting, "broker", found))
    return [
        LogOutlivesPolicy(topic, setting, source, retention_ms, limit, limit_ms)
        for topic, setting, source, retention_ms in observed
        if retention_ms < 0 or retention_ms > limit_ms
    ]
