"""docs/configuration.md's tables are what ``tools/settings_doc.py`` renders from the code, and
every ``TURNLOG_*`` variable the code, the deploy scripts and the tests read is in them."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from turnlog.tools import settings_doc

ROOT = Path(__file__).resolve().parents[2]
#: Where variables are read: the library's folders, the deploy scripts and configs, CI, the
#: tests, the examples and the bench scripts under docs/.
SOURCES = ("turnlog", "producers", "stream_processors", "sinks", "schemas", "deploy", "tools", "tests", ".ci",
           "examples", "docs")
SUFFIXES = {".py", ".sh", ".yml", ".yaml", ".js", ".toml"}
#: Files that name variables without reading them: the generator's own list, this test.
NOT_READERS = {Path(settings_doc.__file__).resolve(), Path(__file__).resolve()}
#: A whole variable name (a prefix such as ``TURNLOG_KAFKA_`` ends in ``_`` and is left out).
VARIABLE = re.compile(r"\bTURNLOG_[A-Z0-9_]*[A-Z0-9]\b")


@functools.cache
def _read_variables() -> frozenset[str]:
    found: set[str] = set()
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*"):
            if path.resolve() in NOT_READERS or "__pycache__" in path.parts:
                continue
            if path.is_file() and (path.suffix in SUFFIXES or path.name == "run"):
                found.update(VARIABLE.findall(path.read_text(encoding="utf-8", errors="replace")))
    return frozenset(found)


def test_the_generated_tables_are_up_to_date() -> None:
    current = settings_doc.DOC.read_text(encoding="utf-8")
    assert settings_doc.rendered_document(current) == current, "run: python -m turnlog.tools.settings_doc"


def test_every_variable_the_code_reads_is_documented() -> None:
    documented = set(settings_doc.settings_variables()) | set(settings_doc.OTHER_VARIABLES)
    undocumented = _read_variables() - documented
    assert not undocumented, f"add these to TurnlogSettings or tools/settings_doc.OTHER_VARIABLES: {sorted(undocumented)}"


def test_no_other_variable_shadows_a_setting_and_every_one_is_still_read() -> None:
    settings = set(settings_doc.settings_variables())
    assert not settings & set(settings_doc.OTHER_VARIABLES)
    assert set(settings_doc.OTHER_VARIABLES) <= _read_variables()  # none documented after it went


def test_every_setting_has_a_description() -> None:
    assert all(settings_doc.settings_variables().values())
