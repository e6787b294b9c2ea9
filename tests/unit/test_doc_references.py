"""Every repository path the docs and the library's docstrings and comments cite exists.

A path is a run of ``name/`` parts under one of the repository's top folders (``docs/design.md``,
``stream_processors/fetching.py``, ``turnlog/sinks/tables.py``: the installed name of a folder
beside ``turnlog/``). ``folder/module.attribute`` cites ``attribute`` of ``module.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Folders installed as subpackages of ``turnlog`` (pyproject.toml, ``package-dir``).
SUBPACKAGES = ("producers", "stream_processors", "sinks", "schemas", "deploy", "tools")
TOP = ("turnlog", *SUBPACKAGES, "tests", "docs", "examples", ".ci")
#: A path: a top folder, then path characters, ending in a word character.
TOPS = "|".join(re.escape(top) for top in TOP)
PATH = re.compile(rf"(?<![\w./-])((?:{TOPS})/[\w./-]*\w)")
#: A path followed by one of these is a pattern (``tests/adapters/test_<framework>.py``,
#: ``docs/adapters/*.md``, ``venvs/${name}``), not a path.
PATTERN_MARKS = frozenset("*{}<>$")


def _cited_in() -> list[Path]:
    docs = [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    code = [path for folder in ("turnlog", *SUBPACKAGES) for path in sorted((ROOT / folder).rglob("*.py"))]
    return docs + code


#: Suffixes of the files the docs cite; any other ``.name`` after a module is an attribute.
FILE_SUFFIXES = frozenset({"py", "md", "sh", "json", "js", "html", "css", "png", "txt", "toml", "yml", "yaml", "ini",
                           "sql", "cfg", "xml", "jsonl", "tsv", "csv"})


def _exists(cited: str) -> bool:
    candidates = [cited]
    for package in SUBPACKAGES:  # turnlog/sinks/x.py is sinks/x.py in the repository
        if cited.startswith(f"turnlog/{package}/") or cited == f"turnlog/{package}":
            candidates.append(cited.removeprefix("turnlog/"))
    for candidate in list(candidates):  # sinks/driver_errors.store_errors: the module sinks/driver_errors.py
        head, dot, suffix = candidate.rpartition(".")
        if dot and "/" not in suffix and suffix not in FILE_SUFFIXES:
            candidates.append(f"{head.split('.')[0]}.py")
    return any((ROOT / candidate).exists() for candidate in candidates)


def test_every_cited_path_exists() -> None:
    dangling: dict[str, list[str]] = {}
    for source in _cited_in():
        text = source.read_text(encoding="utf-8", errors="replace")
        for match in PATH.finditer(text):
            cited = match.group(1).rstrip(".")
            after = text[match.end():match.end() + 1]
            if after in PATTERN_MARKS or _exists(cited):
                continue
            dangling.setdefault(cited, []).append(str(source.relative_to(ROOT)))
    assert not dangling, f"cited paths that do not exist: {dangling}"
