"""Baseline S0: a bare Faust agent that consumes one topic and does nothing else.

Run as ``python -m turnlog.tools.bench.consume_only SOURCE APP_ID TOTAL RESULT_PATH``
(the benchmark starts it as a child process, on the same app settings as the
sequencer's). The agent reads ``SOURCE`` in batches of up to 1,000
(``stream.take_events(1000, within=1.0)``), counts them, and once it has seen
``TOTAL`` records writes ``{"records", "first_batch", "seconds", "total"}`` as
JSON to ``RESULT_PATH``: the records up to the last full batch, the first
batch's size and the seconds from the first batch to the last full one. The
closing partial batch is left out: ``take_events`` yields it only when its
``within`` timeout runs out, a wait that is not Faust's cost per record.
Nothing is produced, so this is the floor of any Faust app here: what Faust
costs per record before an agent does any work.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import faust

from turnlog.settings import load_settings
from turnlog.stream_processors.app import make_app, raw_topic
from turnlog.stream_processors.worker import run_worker

#: The batch S0 takes (the figure the issue quotes: ``take_events(1000)``).
TAKE = 1000


def main() -> None:
    source_name, app_id, total_text, result_path = sys.argv[1:5]
    total = int(total_text)
    settings = load_settings()
    app = make_app(settings, app_id)
    source = raw_topic(app, source_name)
    seen = {"records": 0, "first_at": 0.0, "first_batch": 0, "full_records": 0, "full_at": 0.0, "written": False}

    @app.agent(source, name="consume-only")
    async def consume(stream: faust.StreamT[bytes]) -> None:
        # The agent gets a faust.Stream, which has take_events; faust types it as StreamT, which has not.
        async for events in stream.take_events(TAKE, within=1.0):  # type: ignore[attr-defined]
            now = time.monotonic()
            if not seen["records"]:
                seen["first_at"], seen["first_batch"] = now, len(events)
            seen["records"] += len(events)
            if len(events) >= TAKE:
                seen["full_records"], seen["full_at"] = seen["records"], now
            if seen["records"] >= total and not seen["written"]:
                seen["written"] = True
                result = {
                    "records": seen["full_records"], "first_batch": seen["first_batch"],
                    "seconds": seen["full_at"] - seen["first_at"], "total": seen["records"],
                }
                Path(result_path).write_text(json.dumps(result))

    run_worker(app, settings)


if __name__ == "__main__":
    main()
