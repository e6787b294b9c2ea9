"""Generate the checked-in JSON Schema files of the current event model version.

Run ``python -m turnlog.schemas.generate`` after changing ``events.py``; a unit
test fails while the files and the model disagree.

Only the current version's files (``*.v{SCHEMA_VERSION}.schema.json``) are
written. The files of earlier versions are frozen: they are the contract of
readers still running that version. The first run after ``SCHEMA_VERSION`` is
raised freezes the previous version's files first: their SHA-256 go into
``json/frozen.json`` (``{version: {file: sha256}}``), which the generator only
ever adds to and a unit test holds the files to.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import msgspec

from turnlog.schemas.events import EVENT_TYPES, SCHEMA_VERSION, SCHEMA_VERSIONS, Event

SCHEMA_DIR = Path(__file__).parent / "json"
#: ``{version: {file name: sha256}}`` of every frozen version (all below ``SCHEMA_VERSION``).
FROZEN_FILE = SCHEMA_DIR / "frozen.json"

#: JSON values a field added after version 1 holds while unused (its falsy default).
_UNUSED: list[Any] = [False, None, 0, "", [], {}]


def schema_file_name(tag: str, version: int = SCHEMA_VERSION) -> str:
    """``event.v2.schema.json`` for the union (``tag="event"``), ``turn.completed.v2.schema.json``, ..."""
    return f"{tag}.v{version}.schema.json"


def render_schemas() -> dict[str, str]:
    """Return ``{file name: JSON text}`` for the union and each event type, current version."""
    v = SCHEMA_VERSION
    files = {schema_file_name("event"): _render(Event, f"turnlog event, version {v} (any type)")}
    for event_type in EVENT_TYPES:
        tag = str(event_type.__struct_config__.tag)
        files[schema_file_name(tag)] = _render(event_type, f"turnlog {tag} event, version {v}")
    return files


def _render(type_: object, title: str) -> str:
    schema = msgspec.json.schema(type_)
    for event_type in EVENT_TYPES:
        definition = schema.get("$defs", {}).get(event_type.__name__)
        if definition is not None and event_type.added_in:
            definition["allOf"] = [
                _version_rule(name, version) for name, version in sorted(event_type.added_in.items())
            ]
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, **schema}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def _version_rule(field: str, version: int) -> dict[str, Any]:
    """The model's rule in JSON Schema: an event that uses ``field`` says at least ``version``
    (or leaves ``schema_version`` out, and the model fills it in)."""
    return {
        "if": {"required": [field], "properties": {field: {"not": {"enum": _UNUSED}}}},
        "then": {"properties": {"schema_version": {"enum": [n for n in SCHEMA_VERSIONS if n >= version]}}},
    }


def frozen_hashes() -> dict[int, dict[str, str]]:
    """The frozen versions' files and their SHA-256, from ``json/frozen.json`` ({} if absent)."""
    if not FROZEN_FILE.exists():
        return {}
    return {int(version): files for version, files in json.loads(FROZEN_FILE.read_text("utf-8")).items()}


def freeze_previous() -> list[int]:
    """Freeze every version below ``SCHEMA_VERSION`` not frozen yet: the SHA-256 of its files as
    they are on disk go into ``json/frozen.json``. Entries already there are never changed.
    Returns the versions frozen now.

    Raises:
        FileNotFoundError: a version to freeze has no files on disk (it was never generated).
        ValueError: a file to freeze differs from the one committed (HEAD): a released
            version is frozen as it was released, not as edited since.
    """
    frozen = frozen_hashes()
    added = []
    for version in SCHEMA_VERSIONS:
        if version >= SCHEMA_VERSION or version in frozen:
            continue
        paths = sorted(SCHEMA_DIR.glob(f"*.v{version}.schema.json"))
        for path in paths:
            committed = _committed(path)
            if committed is not None and committed != path.read_bytes():
                raise ValueError(f"{path.name} differs from the committed file; restore it (git checkout -- {path})"
                                 " before the version it belongs to is frozen")
        files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
        if not files:
            raise FileNotFoundError(f"no schema files of version {version} in {SCHEMA_DIR} to freeze")
        frozen[version] = files
        added.append(version)
    if added:
        body = {str(version): dict(sorted(files.items())) for version, files in sorted(frozen.items())}
        FROZEN_FILE.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    return added


def _committed(path: Path) -> bytes | None:
    """``path`` as the checkout's HEAD holds it; None outside a git checkout, without git, or
    for a file HEAD does not hold."""
    try:
        name = subprocess.run(["git", "-C", str(path.parent), "ls-files", "--full-name", "--error-unmatch", path.name],
                              capture_output=True, text=True, check=True).stdout.strip()
        return subprocess.run(["git", "-C", str(path.parent), "show", f"HEAD:{name}"],
                              capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    SCHEMA_DIR.mkdir(exist_ok=True)
    for version in freeze_previous():
        print(f"froze version {version}'s files in {FROZEN_FILE}")
    for name, text in render_schemas().items():
        (SCHEMA_DIR / name).write_text(text, encoding="utf-8")
        print(f"wrote {SCHEMA_DIR / name}")


if __name__ == "__main__":
    main()
