"""Generate the checked-in JSON Schema files from the event model.

Run ``python -m turnlog.schemas.generate`` after changing ``events.py``; a unit
test fails while the files and the model disagree.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from turnlog.schemas.events import EVENT_TYPES, Event

SCHEMA_DIR = Path(__file__).parent / "json"


def render_schemas() -> dict[str, str]:
    """Return ``{file name: JSON text}`` for the union and each event type."""
    files = {"event.v1.schema.json": _render(Event, "turnlog event, version 1 (any type)")}
    for event_type in EVENT_TYPES:
        tag = event_type.__struct_config__.tag
        files[f"{tag}.v1.schema.json"] = _render(event_type, f"turnlog {tag} event, version 1")
    return files


def _render(type_: object, title: str) -> str:
    schema = msgspec.json.schema(type_)
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, **schema}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main() -> None:
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name, text in render_schemas().items():
        (SCHEMA_DIR / name).write_text(text, encoding="utf-8")
        print(f"wrote {SCHEMA_DIR / name}")


if __name__ == "__main__":
    main()
