"""How many copies of each topic the cluster keeps: the replication factor and
``min.insync.replicas`` of every topic turnlog or Faust creates, from the settings.

One rule, used by ``turnlog topics create`` and ``check`` and by the Faust workers at
start (``turnlog.stream_processors.app.configure_replication``):

- replication factor: ``TURNLOG_REPLICATION_FACTOR``, else ``min(3, live brokers)``;
- ``min.insync.replicas``: ``TURNLOG_MIN_INSYNC_REPLICAS``, else the replication
  factor less one, at least 1: with ``acks=all`` a write then still succeeds with
  one replica down, and is on at least two brokers whenever there are two;
- ``min.insync.replicas`` never above the replication factor, and below it whenever
  the factor is above 1 (equal, one broker down would stop every write).

"Live brokers" are the brokers in the cluster's metadata: those that answer now.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnlog.exceptions import ConfigurationError
from turnlog.kafka.client_errors import broker_errors
from turnlog.kafka.clients import admin
from turnlog.settings import TurnlogSettings

__all__ = ["Replication", "DEFAULT_MAX_REPLICATION_FACTOR", "replication_for", "live_broker_count",
           "resolve_replication"]

#: The default replication factor on a cluster of at least this many brokers.
DEFAULT_MAX_REPLICATION_FACTOR = 3


@dataclass(frozen=True, slots=True)
class Replication:
    """The replication every topic gets, and the live broker count it was resolved against."""

    replication_factor: int
    min_insync_replicas: int
    live_brokers: int

    def topic_config(self) -> dict[str, str]:
        """The topic configs this sets explicitly on every topic (``min.insync.replicas``)."""
        return {"min.insync.replicas": str(self.min_insync_replicas)}

    def require_enough_brokers(self) -> None:
        """Refuse a replication factor the live brokers cannot hold.

        Raises:
            ConfigurationError: the replication factor is above the live broker count.
        """
        if self.replication_factor > self.live_brokers:
            raise ConfigurationError(
                f"replication factor {self.replication_factor} (TURNLOG_REPLICATION_FACTOR) is more than the "
                f"{self.live_brokers} live broker(s): a topic cannot have more replicas than brokers "
                f"(start the missing brokers, or set TURNLOG_REPLICATION_FACTOR to at most {self.live_brokers})"
            )

    def __str__(self) -> str:
        return (f"replication factor {self.replication_factor}, min.insync.replicas {self.min_insync_replicas} "
                f"({self.live_brokers} live broker(s))")


def replication_for(settings: TurnlogSettings, live_brokers: int) -> Replication:
    """The replication of ``settings`` on a cluster of ``live_brokers`` live brokers (the
    rule in the module docstring). It does not refuse a factor above ``live_brokers``: see
    :meth:`Replication.require_enough_brokers`.

    Raises:
        ConfigurationError: no live broker and no explicit replication factor, or
            ``min.insync.replicas`` above the replication factor, or equal to it while
            the factor is above 1. The message names both values and the broker count.
    """
    explicit_factor = settings.replication_factor
    if explicit_factor is None and live_brokers < 1:
        raise ConfigurationError("no live broker in the cluster's metadata: cannot choose a replication factor "
                                 "(set TURNLOG_REPLICATION_FACTOR, or start the brokers)")
    factor = explicit_factor if explicit_factor is not None else min(DEFAULT_MAX_REPLICATION_FACTOR, live_brokers)
    min_insync = settings.min_insync_replicas
    if min_insync is None:
        min_insync = max(1, factor - 1)
    else:
        source = "TURNLOG_REPLICATION_FACTOR" if explicit_factor is not None else f"default min(3, {live_brokers})"
        values = (f"min.insync.replicas {min_insync} (TURNLOG_MIN_INSYNC_REPLICAS) with replication factor "
                  f"{factor} ({source}, {live_brokers} live broker(s))")
        if min_insync > factor:
            raise ConfigurationError(f"{values}: no write could ever be acknowledged; use at most "
                                     f"{max(1, factor - 1)}")
        if factor > 1 and min_insync >= factor:
            raise ConfigurationError(f"{values}: every write would stop while any one replica is down; use at most "
                                     f"{factor - 1}")
    return Replication(replication_factor=factor, min_insync_replicas=min_insync, live_brokers=live_brokers)


def live_broker_count(settings: TurnlogSettings, *, timeout: float = 10.0) -> int:
    """The brokers in the cluster's metadata (those that answer), asked through an admin client.

    Raises:
        BrokerError: no broker answered within ``timeout`` seconds.
    """
    client = admin(settings)
    with broker_errors("cluster metadata"):
        return len(client.list_topics(timeout=timeout).brokers)


def resolve_replication(settings: TurnlogSettings, *, timeout: float = 10.0) -> Replication:
    """The replication of ``settings`` on the cluster as it is now (:func:`replication_for`
    with :func:`live_broker_count`).

    Raises:
        ConfigurationError: as :func:`replication_for`.
        BrokerError: no broker answered within ``timeout`` seconds.
    """
    return replication_for(settings, live_broker_count(settings, timeout=timeout))
