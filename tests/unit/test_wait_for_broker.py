"""``wait_for_broker``'s backoff and deadline (``broker_answers`` stubbed: no broker)."""

from __future__ import annotations

import time

import pytest

from turnlog.exceptions import ConfigurationError
from turnlog.kafka import cluster
from turnlog.settings import TurnlogSettings


def answers_after(monkeypatch, failures: int) -> list[float]:
    calls: list[float] = []

    def broker_answers(settings, timeout=5.0):
        calls.append(time.monotonic())
        return len(calls) > failures

    monkeypatch.setattr(cluster, "broker_answers", broker_answers)
    return calls


def test_it_asks_again_backing_off_until_the_broker_answers(monkeypatch, caplog):
    calls = answers_after(monkeypatch, 2)
    cluster.wait_for_broker(TurnlogSettings(bootstrap_servers="127.0.0.1:1"))
    assert len(calls) == 3
    first, second = calls[1] - calls[0], calls[2] - calls[1]
    assert 0.45 <= first < 0.9 and 0.95 <= second < 1.5  # 0.5 s, then doubled
    assert caplog.text.count("waiting for a Kafka broker") == 1


def test_it_gives_up_at_the_deadline_naming_the_servers(monkeypatch):
    calls = answers_after(monkeypatch, 10**6)
    began = time.monotonic()
    with pytest.raises(ConfigurationError, match="127.0.0.1:1"):
        cluster.wait_for_broker(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), timeout=0.2)
    assert len(calls) == 2 and time.monotonic() - began < 2


def test_an_answering_broker_is_not_waited_for(monkeypatch):
    calls = answers_after(monkeypatch, 0)
    began = time.monotonic()
    cluster.wait_for_broker(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), timeout=0)
    assert len(calls) == 1 and time.monotonic() - began < 0.4


def test_work_is_tried_again_while_the_cluster_is_unavailable_and_other_errors_pass():
    from turnlog.kafka.exceptions import BrokerError, BrokerUnavailableError

    attempts: list[int] = []

    def creating() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise BrokerUnavailableError("describing the configs: Timed out waiting for controller", retriable=True)
        return "created"

    assert cluster.while_unavailable(creating, "creating the topics") == "created"
    assert len(attempts) == 3

    def refused() -> None:
        attempts.append(1)
        raise BrokerError("creating topic t: policy violation", retriable=False)

    attempts.clear()
    with pytest.raises(BrokerError) as raised:
        cluster.while_unavailable(refused, "creating the topics")
    assert not raised.value.retriable and len(attempts) == 1
