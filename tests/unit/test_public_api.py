import inspect

import turnlog
import turnlog.producers
import turnlog.schemas
import turnlog.sinks
from turnlog.exceptions import TurnlogError


def test_all_lists_exactly_the_public_names():
    for module in (turnlog, turnlog.producers, turnlog.schemas, turnlog.sinks):
        public = {name for name in vars(module) if not name.startswith("_") and not inspect.ismodule(getattr(module, name))}
        declared = set(module.__all__) - {"__version__"}
        assert declared == public - {"annotations", "make_url", "URL", "ArgumentError"}, module.__name__


def test_every_exception_derives_from_the_root():
    for module in (turnlog, turnlog.producers, turnlog.schemas, turnlog.sinks):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, Exception):
                assert issubclass(obj, TurnlogError), name
