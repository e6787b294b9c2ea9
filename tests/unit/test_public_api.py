import inspect
import subprocess
import sys

import turnlog
import turnlog.producers
import turnlog.schemas
import turnlog.sinks
from turnlog.exceptions import TurnlogError


def test_all_lists_exactly_the_public_names():
    for module in (turnlog, turnlog.producers, turnlog.schemas, turnlog.sinks):
        # dir(), not vars(): turnlog's own names are loaded on first use (its __getattr__).
        public = {name for name in dir(module) if not name.startswith("_") and not inspect.ismodule(getattr(module, name))}
        declared = set(module.__all__) - {"__version__"}
        assert declared == public - {"annotations", "make_url", "URL", "ArgumentError"}, module.__name__


def test_every_exception_derives_from_the_root():
    for module in (turnlog, turnlog.producers, turnlog.schemas, turnlog.sinks):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, Exception):
                assert issubclass(obj, TurnlogError), name


def test_the_lazy_names_are_the_modules_own_objects():
    assert turnlog.SessionRecorder is turnlog.producers.SessionRecorder
    assert turnlog.TurnPartial is turnlog.schemas.TurnPartial
    from turnlog import SessionRecorder, TurnlogSettings, kafka  # a name, a name, a submodule

    assert SessionRecorder is turnlog.producers.SessionRecorder
    assert TurnlogSettings.__module__ == "turnlog.settings"
    assert kafka.__name__ == "turnlog.kafka"


def test_importing_the_schemas_loads_neither_clients_nor_the_database_layer():
    """A service that only decodes events (``import turnlog.schemas``) does not pay for the
    recorder: turnlog's package imports its public names on first use, not at import."""
    heavy = ("sqlalchemy", "confluent_kafka", "aiokafka", "faust")
    probe = (
        "import sys, turnlog.schemas\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('turnlog'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded_heavy, loaded_turnlog = done.stdout.splitlines()
    assert loaded_heavy == "", f"import turnlog.schemas loaded {loaded_heavy}"
    others = [m for m in loaded_turnlog.split(",") if m not in ("turnlog", "turnlog.exceptions", "turnlog.schemas")
              and not m.startswith("turnlog.schemas.")]
    assert not others, f"import turnlog.schemas loaded {others}"
