"""The private members of Faust and aiokafka that stream_processors/fetching.py and recovery.py
use, checked on the pinned releases (the versions are pinned in pyproject.toml and checked by
test_faust_fetching.py and test_faust_recovery.py; the methods they replace are pinned by hash
there). A release that renames or drops one fails here, naming the member, before a worker
fails on it at run time."""

from __future__ import annotations

import inspect

import faust
import pytest
from aiokafka.consumer.consumer import AIOKafkaConsumer
from aiokafka.consumer.fetcher import Fetcher
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer
from mode.utils.objects import cached_property


def _source(owner: type, member: str) -> str:
    return inspect.getsource(getattr(owner, member))


@pytest.mark.parametrize("member", ["_set_recovery_ended", "_is_changelog_tp", "_build_highwaters", "_wait"])
def test_recovery_methods_the_ordered_recovery_calls_exist(member: str) -> None:
    assert callable(getattr(Recovery, member))  # recovery.py calls each on itself


def test_the_app_s_fetcher_and_the_table_manager_s_recovery_are_where_recovery_py_reads_them() -> None:
    assert isinstance(inspect.getattr_static(faust.App, "_fetcher"), cached_property)  # app._fetcher.maybe_start()
    assert "self._recovery" in inspect.getsource(TableManager)  # OrderedTableManager.recovery caches it there


def test_the_aiokafka_consumer_hands_its_settings_to_the_fetcher_it_makes_at_start() -> None:
    # fetching.py sets _isolation_level and _fetch_max_wait_ms on the consumer before start(),
    # and swaps the class of the _fetcher that start() makes.
    init, start = _source(AIOKafkaConsumer, "__init__"), _source(AIOKafkaConsumer, "start")
    for attribute in ("_isolation_level", "_fetch_max_wait_ms"):
        assert f"self.{attribute} = " in init
    assert "self._fetcher = Fetcher(" in start
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in start
    assert "isolation_level=self._isolation_level" in start


def test_the_fetcher_reads_what_prompt_fetcher_and_the_snapshot_drain_rely_on() -> None:
    actions = _source(Fetcher, "_get_actions_per_node")
    assert "if tp in self._records:" in actions  # a partition with undrained records is left out
    assert "self._fetch_max_wait_ms," in actions  # read for each request, so PromptFetcher's value counts
    init = _source(Fetcher, "__init__")
    assert "self._records = " in init and "self._subscriptions = " in init


@pytest.mark.parametrize("member", ["_get_active_partitions", "_buffered_partitions"])
def test_faust_consumer_members_the_snapshot_fetch_reads_exist(member: str) -> None:
    assert member in inspect.getsource(Consumer)
