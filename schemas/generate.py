"""Generate the checked-in JSON Schema files of the current event model version.

Run ``python -m turnlog.schemas.generate`` after changing ``events.py``; a unit
test fails while the files and the model disagree.

Only the current version's files (``*.v{SCHEMA_VERSION}.schema.json``) are
written. The files of earlier versions (``*.v1.schema.json``) are frozen: they
are the contract of readers still running that version, and a unit test pins
their content.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from turnlog.schemas.events import EVENT_TYPES, SCHEMA_VERSION, SCHEMA_VERSIONS, Event

SCHEMA_DIR = Path(__file__).parent / "json"

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


def main() -> None:
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name, text in render_schemas().items():
        (SCHEMA_DIR / name).write_text(text, encoding="utf-8")
        print(f"wrote {SCHEMA_DIR / name}")


if __name__ == "__main__":
    main()
