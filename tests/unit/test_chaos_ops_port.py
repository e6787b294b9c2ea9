"""`turnlog chaos --ops-port`: the run's own API for watching it on /ops. Refused before anything
starts when no token could read /ops (none grants every fleet)."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnlog.exceptions import ConfigurationError
from turnlog.settings import TurnlogSettings
from turnlog.tools.demo.chaos import ChaosOptions, run_chaos


def test_ops_port_without_a_token_for_every_fleet_is_refused_before_the_run_starts(tmp_path: Path):
    settings = TurnlogSettings(api_tokens={"tok-a": ["fleet-a"]}, database_url=f"sqlite:///{tmp_path / 'nothing.db'}")
    with pytest.raises(ConfigurationError, match="--ops-port"):
        run_chaos(settings, ChaosOptions(sessions_dir=tmp_path, ops_port=18080, log_dir=tmp_path / "logs"))
    assert not (tmp_path / "logs").exists()  # nothing was started

