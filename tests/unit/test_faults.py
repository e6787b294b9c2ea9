import pytest

from turnlog.exceptions import ConfigurationError
from turnlog.faults import POINTS, FaultAction, parse_faults


def test_fault_specs_parse():
    armed = parse_faults("sink.after_write=kill, sink.after_commit=kill@3,producer.after_produce=stall:250")
    assert armed == {
        "sink.after_write": FaultAction("kill", on_hit=1),
        "sink.after_commit": FaultAction("kill", on_hit=3),
        "producer.after_produce": FaultAction("stall", stall_ms=250),
    }
    assert parse_faults("") == {}


@pytest.mark.parametrize("spec", ["sink.nowhere=kill", "sink.after_write=explode", "sink.after_write=kill@x", "sink.after_write=stall:"])
def test_bad_fault_specs_fail_naming_the_problem(spec):
    with pytest.raises(ConfigurationError, match="TURNLOG_FAULTS"):
        parse_faults(spec)


def test_every_point_is_placed_in_the_code():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    sources = "".join(p.read_text() for d in ("producers", "stream_processors", "sinks") for p in (root / d).rglob("*.py"))
    for name in POINTS:
        assert f'fault_point("{name}")' in sources, name
