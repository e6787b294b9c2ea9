"""Baseline S: a bare Faust agent that copies one topic to another, nothing else.

Run as ``python -m turnlog.tools.bench.passthrough SOURCE SINK APP_ID`` (the benchmark
starts it as a child process, on the same app settings as the sequencer's).
"""

from __future__ import annotations

import sys

import faust

from turnlog.settings import load_settings
from turnlog.stream_processors.app import make_app, raw_topic
from turnlog.stream_processors.worker import run_worker


def main() -> None:
    source_name, sink_name, app_id = sys.argv[1:4]
    settings = load_settings()
    app = make_app(settings, app_id)
    source, sink = raw_topic(app, source_name), raw_topic(app, sink_name)

    @app.agent(source, name="pass-through")
    async def copy(stream: faust.StreamT[bytes]) -> None:
        async for key, value in stream.items():
            await sink.send(key=key, value=value)

    run_worker(app, settings)


if __name__ == "__main__":
    main()
