"""The ``turnlog`` command line: one subcommand per service and operator tool."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError

from turnlog.settings import SECRET_SETTINGS, TurnlogSettings, load_settings

if TYPE_CHECKING:
    from turnlog.crypto.envelope import EventOpener

app = typer.Typer(
    help="turnlog: crash-safe, incremental persistence for long-lived agent sessions.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # a local may hold a DSN or a token
)
topics_app = typer.Typer(help="Manage turnlog's Kafka topics.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")
keys_app = typer.Typer(help="Manage the key encryption keys (KEKs) that wrap each session's data keys.",
                       no_args_is_help=True)
app.add_typer(keys_app, name="keys")
KeyringPath = Annotated[
    Path | None,
    typer.Option("--keyring", envvar="TURNLOG_KEYRING_FILE", help="The keyring file (TURNLOG_KEYRING_FILE)."),
]

DatabaseUrl = Annotated[
    str | None,
    typer.Option("--database-url", envvar="TURNLOG_DATABASE_URL",
                 help="Store URL (sqlite:///PATH or postgresql+psycopg://...).")
]
Bootstrap = Annotated[
    str | None, typer.Option("--bootstrap-servers", envvar="TURNLOG_BOOTSTRAP_SERVERS", help="Kafka bootstrap servers.")
]


def _settings(**overrides: object) -> TurnlogSettings:
    try:
        settings = load_settings(**overrides)
    except ValidationError as e:
        for error in e.errors():
            if not error["loc"]:  # a check of several settings: its input is all of them, secrets included
                typer.echo(f"turnlog: bad settings: {error['msg']}", err=True)
                continue
            name = str(error["loc"][0])
            if name in SECRET_SETTINGS:  # the key path or the value would print a secret
                typer.echo(f"turnlog: bad setting TURNLOG_{name.upper()}: {error['msg']} (value not shown)", err=True)
                continue
            field = ".".join(str(part) for part in error["loc"])
            typer.echo(f"turnlog: bad setting TURNLOG_{field.upper()}: {error['msg']} (got {error.get('input')!r})",
                       err=True)
        raise typer.Exit(2) from None
    except SettingsError as e:  # a JSON setting that is not JSON; its message names the field, not the value
        typer.echo(f"turnlog: bad settings: {e} (a JSON value is expected; value not shown)", err=True)
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
        stream=sys.stderr,
    )
    # httpx logs every request at INFO (the operations page's Prometheus queries: 7 a refresh); DEBUG keeps them.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("httpx").setLevel(logging.WARNING)
    from turnlog.faults import armed_faults

    armed_faults()  # a malformed TURNLOG_FAULTS fails here, at start-up (ConfigurationError), not at a fault point
    return settings


def _service_settings(**overrides: object) -> TurnlogSettings:
    """Settings for a long-running service: also serves metrics when TURNLOG_METRICS_PORT is set."""
    settings = _settings(**overrides)
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port)
        logging.getLogger(__name__).info("metrics on :%d/metrics", settings.metrics_port)
    return settings


@topics_app.command("create")
def topics_create(bootstrap_servers: Bootstrap = None) -> None:
    """Create <prefix>.events, .transcript, .dlq and the Faust apps' topics, with explicit partitions, replication
    and retention; report existing topics whose settings differ (`turnlog topics check` fixes them)."""
    from turnlog.deploy.topics import create_topics

    settings = _settings(bootstrap_servers=bootstrap_servers)
    result = create_topics(settings, log_differences=False)  # printed here instead
    typer.echo(f"topics with {result.replication}:")
    for spec in result.specs:
        typer.echo(f"{spec.topic}: {'created' if spec.topic in result.created else 'exists'} "
                   f"({spec.partitions} partition{'' if spec.partitions == 1 else 's'})")
    for difference in result.differences:
        typer.echo(str(difference))
    if result.differences:
        typer.echo(f"{len(result.differences)} setting(s) of existing topics differ: run `turnlog topics check`")


@topics_app.command("check")
def topics_check(
    bootstrap_servers: Bootstrap = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only report; change nothing.")] = False,
) -> None:
    """Report every topic whose partitions, replication factor, min.insync.replicas, retention.ms, cleanup.policy or
    max.message.bytes differ from the settings, and fix what a config change can; warn where the log keeps content
    longer than TURNLOG_RETENTION_DAYS or TURNLOG_ERASURE_DEADLINE_DAYS. Exit 0 when every topic is as the settings
    ask (after the fixes), 1 when something remains (the warnings do not count)."""
    from turnlog.deploy.topics import check_topics

    settings = _settings(bootstrap_servers=bootstrap_servers)
    result = check_topics(settings, fix=not dry_run)
    typer.echo(f"{len(result.topics)} topics checked against {result.replication}")
    if result.offline_brokers:
        typer.echo(f"broker(s) {', '.join(map(str, sorted(result.offline_brokers)))} hold replicas of these topics "
                   "but do not answer: nothing was changed")
    for difference in result.differences:
        typer.echo(str(difference))
    remaining = sum(not difference.resolved for difference in result.differences)
    fixed = len(result.differences) - remaining
    if not result.differences:
        typer.echo("every topic is as the settings ask")
    else:
        typer.echo(f"{len(result.differences)} difference(s): {fixed} fixed, {remaining} remaining")
    for finding in result.log_retention:
        typer.echo(f"warning: {finding}")
    raise typer.Exit(0 if result.ok else 1)


def _opener(settings: TurnlogSettings) -> EventOpener | None:
    """The reader's opener of sealed events (``turnlog.crypto.config.event_opener``), checked
    before anything else starts: a keyring that cannot be used, or lacks the agents' KEK, exits 2."""
    from turnlog.crypto.config import event_opener
    from turnlog.crypto.keys import KeyMaterialError

    try:
        return event_opener(settings)
    except KeyMaterialError as e:
        typer.echo(f"turnlog: {e}", err=True)
        raise typer.Exit(2) from None


def _keyring_path(keyring: Path | None) -> Path:
    if keyring is None:
        typer.echo("turnlog: give --keyring PATH or set TURNLOG_KEYRING_FILE", err=True)
        raise typer.Exit(2)
    return keyring


def _new_kek(keyring: Path | None, *, rotate: bool) -> None:
    """Create the keyring, or put a new KEK first in it; print the public half agents are given."""
    from turnlog.crypto.keys import KeyMaterialError, create_keyring_file, public_key_text, rotate_keyring_file

    path = _keyring_path(keyring)
    try:
        public = rotate_keyring_file(path) if rotate else create_keyring_file(path)
    except KeyMaterialError as e:
        typer.echo(f"turnlog: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{'rotated' if rotate else 'created'} {path}: KEK {public.id} is current; give agents:")
    typer.echo(f"TURNLOG_KEK_PUBLIC_KEY={public_key_text(public.key)}")


@keys_app.command("init")
def keys_init(keyring: KeyringPath = None) -> None:
    """Create a keyring (mode 0600) holding one new KEK; print the public half agents are given."""
    _new_kek(keyring, rotate=False)


@keys_app.command("rotate")
def keys_rotate(keyring: KeyringPath = None) -> None:
    """Put a new KEK first in the keyring; the old ones stay to open what they wrapped. Restart the readers
    (sink, API, ...) with the new keyring first, then give agents the new public key."""
    _new_kek(keyring, rotate=True)


@keys_app.command("public")
def keys_public(keyring: KeyringPath = None) -> None:
    """Print the current KEK's public half (TURNLOG_KEK_PUBLIC_KEY for agents) and every KEK id held."""
    from turnlog.crypto.keys import FileKekProvider, KeyMaterialError, public_key_text

    try:
        ring = FileKekProvider(_keyring_path(keyring)).ring()
    except KeyMaterialError as e:
        typer.echo(f"turnlog: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"TURNLOG_KEK_PUBLIC_KEY={public_key_text(ring.current.key)}")
    typer.echo(f"KEKs held (current first): {', '.join(ring.ids)}")




@keys_app.command("erasure-issuer")
def keys_erasure_issuer(
    name: Annotated[str, typer.Option(help="The issuer's name (TURNLOG_ERASURE_ISSUER).")] = "turnlog",
) -> None:
    """Make a new erasure issuer key pair: the private half for the hosts that issue erasures (the CLI's
    host, the API, the sink), the public half for every reader of the erasure ledger."""
    import json

    from turnlog.crypto.ledger_signatures import new_issuer_key

    private, public = new_issuer_key()
    typer.echo(f"TURNLOG_ERASURE_ISSUER={name}")
    typer.echo(f"TURNLOG_ERASURE_ISSUER_KEY={private}")
    typer.echo(f"TURNLOG_ERASURE_ISSUERS={json.dumps({name: public})}")
@app.command()
def forget(
    session_id: Annotated[str, typer.Argument(
        help="The session to forget everywhere: its key ('<fleet>:<id>'), or with --fleet the id its agent gave it."
    )],
    fleet: Annotated[
        str | None,
        typer.Option(help="The session's fleet: checked against the store; with it, a session the store does not "
                     "hold (only in agents' spools or in flight) is forgotten too, and the store may be away."),
    ] = None,
    wait: Annotated[float, typer.Option(help="Longest wait for the sink to apply it (seconds).")] = 30.0,
    database_url: DatabaseUrl = None,
    bootstrap_servers: Bootstrap = None,
) -> None:
    """Forget a session: delete its rows, drop it from the log's readers, spools and replays (exit 0: done,
    3: pending, 1: no such session)."""
    import getpass

    from turnlog.ops.erasure import ErasureNotFound, request_erasure
    from turnlog.sinks import open_store
    from turnlog.sinks.exceptions import StoreUnavailableError

    settings = _settings(database_url=database_url, bootstrap_servers=bootstrap_servers)
    store = open_store(settings.database_url)
    try:
        outcome = request_erasure(settings, store, session_id, requested_by=f"cli:{getpass.getuser()}",
                                  fleets=None if fleet is None else [fleet], fleet=fleet, wait_seconds=wait,
                                  unstored=fleet is not None)
    except ErasureNotFound:
        typer.echo(f"turnlog: no session {session_id!r}" + (f" in fleet {fleet!r}" if fleet else ""), err=True)
        raise typer.Exit(1) from None
    except StoreUnavailableError as e:
        typer.echo(f"turnlog: the store is unavailable ({e}); nothing changed. Give --fleet to queue the erasure "
                   "in the ledger alone.", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{outcome.session_id}: {outcome.status} (fleet {outcome.fleet}, requested by {outcome.requested_by} "
               f"at {outcome.requested_at.isoformat()}; ledger record {'written' if outcome.published else 'pending'})")
    raise typer.Exit(0 if outcome.status == "done" else 3)


@app.command("retention-sweep")
def retention_sweep(
    wait: Annotated[float, typer.Option(help="Longest wait for the sink to apply the erasures (seconds).")] = 60.0,
    database_url: DatabaseUrl = None,
    bootstrap_servers: Bootstrap = None,
) -> None:
    """Forget every finalized or abandoned session past TURNLOG_RETENTION_DAYS (per fleet:
    TURNLOG_RETENTION_DAYS_BY_FLEET) once, as the sink's own sweep does; for cron. Prints counts only.
    Exit 0: every session it swept is forgotten (or none was due), 3: some still pending (the sink
    finishes them), 2: no retention policy set, or the store is unavailable."""
    from turnlog.kafka.log_retention import retention_policy_ms
    from turnlog.ops.retention import run_retention_sweep
    from turnlog.sinks import open_store
    from turnlog.sinks.exceptions import StoreUnavailableError

    settings = _settings(database_url=database_url, bootstrap_servers=bootstrap_servers)
    if retention_policy_ms(settings) is None:
        typer.echo("turnlog: no retention policy: set TURNLOG_RETENTION_DAYS or TURNLOG_RETENTION_DAYS_BY_FLEET",
                   err=True)
        raise typer.Exit(2)
    store = open_store(settings.database_url)
    try:
        swept = run_retention_sweep(settings, store, wait_seconds=wait)
    except StoreUnavailableError as e:
        typer.echo(f"turnlog: the store is unavailable ({e}); erasures requested so far stay pending", err=True)
        raise typer.Exit(2) from None
    finally:
        store.close()
    typer.echo(f"retention: {swept.requested} session(s) past the policy, {swept.published} ledger record(s) "
               f"published, {swept.done} forgotten, {swept.pending} pending")
    raise typer.Exit(3 if swept.pending else 0)


@app.command()
def migrate(database_url: DatabaseUrl = None) -> None:
    """Bring the store's schema to the newest Alembic revision."""
    from turnlog.sinks import open_store

    settings = _settings(database_url=database_url)
    open_store(settings.database_url).upgrade_schema()


@app.command()
def sequencer(bootstrap_servers: Bootstrap = None) -> None:
    """Run a sequencer worker (order, dedupe, fence, DLQ). Scale by starting more."""
    from turnlog.deploy.topics import create_topics
    from turnlog.kafka import wait_for_broker, while_unavailable
    from turnlog.stream_processors.sequencer import build_sequencer
    from turnlog.stream_processors.worker import run_worker

    settings = _service_settings(bootstrap_servers=bootstrap_servers)
    # The sequencer produces to the transcript and the DLQ through its own producer,
    # so Faust would never declare them: make sure they exist (idempotent).
    wait_for_broker(settings)
    while_unavailable(lambda: create_topics(settings), "creating the topics")
    run_worker(build_sequencer(settings), settings, "sequencer")


@app.command()
def finalizer(bootstrap_servers: Bootstrap = None, database_url: DatabaseUrl = None) -> None:
    """Run a finalizer worker (guarded exactly-once aggregates)."""
    from turnlog.sinks import open_store
    from turnlog.stream_processors.finalizer import build_finalizer
    from turnlog.stream_processors.worker import run_worker

    settings = _service_settings(bootstrap_servers=bootstrap_servers, database_url=database_url)
    store = open_store(settings.database_url)
    store.wait_for_schema()
    run_worker(build_finalizer(settings, store), settings, "finalizer")


@app.command()
def sink(bootstrap_servers: Bootstrap = None, database_url: DatabaseUrl = None) -> None:
    """Run a SQL sink worker (batched idempotent upserts, offsets in the same transaction)."""
    from turnlog.sinks import open_store
    from turnlog.sinks.service import SinkService

    settings = _service_settings(bootstrap_servers=bootstrap_servers, database_url=database_url)
    opener = _opener(settings)
    # No liveness check per batch (a round trip each): a batch on a dropped
    # connection fails as StoreUnavailableError and the sink applies it again.
    store = open_store(settings.database_url, pool_pre_ping=False)
    store.transcript.opener = opener
    store.wait_for_schema()
    service = SinkService(settings, store)
    # SIGTERM only shortens the stop; correctness never depends on it.
    signal.signal(signal.SIGTERM, lambda *_: service.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: service.stopping.set())
    service.run()


@app.command()
def analytics(bootstrap_servers: Bootstrap = None, database_url: DatabaseUrl = None) -> None:
    """Run the analytics projection: per-fleet figures from the transcript, in its own consumer group."""
    from turnlog.sinks import open_store
    from turnlog.sinks.analytics import AnalyticsProjection
    from turnlog.sinks.service import SinkService

    settings = _service_settings(bootstrap_servers=bootstrap_servers, database_url=database_url)
    store = open_store(settings.database_url)
    store.wait_for_schema()
    projection = AnalyticsProjection(store)
    service = SinkService(settings, store, consumer_group=settings.analytics_group, write=projection.write,
                          component="analytics", forget=projection.forget)
    signal.signal(signal.SIGTERM, lambda *_: service.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: service.stopping.set())
    service.run()


@app.command("lag-exporter")
def lag_exporter(
    bootstrap_servers: Bootstrap = None,
    database_url: DatabaseUrl = None,
    port: Annotated[int | None, typer.Option(help="Serve /metrics on this port (TURNLOG_METRICS_PORT).")] = None,
    interval: Annotated[
        float | None, typer.Option(help="Seconds between reads (TURNLOG_LAG_REFRESH_SECONDS).")
    ] = None,
) -> None:
    """Serve every consumer group's lag per partition (records and seconds) on /metrics, read from
    outside the consumers: the sequencer's commits in Kafka, the sink's and analytics' rows in the store."""
    import functools
    import threading

    from prometheus_client import start_http_server

    from turnlog.kafka.lag import LagMonitor, pipeline_groups, publish_every
    from turnlog.sinks import open_store
    from turnlog.sinks.offsets import stored_group_offsets

    settings = _settings(bootstrap_servers=bootstrap_servers, database_url=database_url, metrics_port=port,
                         lag_refresh_seconds=interval)
    if settings.metrics_port is None:
        typer.echo("turnlog lag-exporter: set --port or TURNLOG_METRICS_PORT", err=True)
        raise typer.Exit(2)
    store = open_store(settings.database_url)
    groups = pipeline_groups(settings, stored_offsets=functools.partial(stored_group_offsets, store))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    start_http_server(settings.metrics_port)
    logging.getLogger(__name__).info("consumer lag on :%d/metrics, read every %g s", settings.metrics_port,
                                     settings.lag_refresh_seconds)
    with LagMonitor(settings, committed_sources=groups, refresh_seconds=settings.lag_refresh_seconds) as monitor:
        publish_every(monitor, settings.lag_refresh_seconds, stopping)
    store.close()


@app.command()
def api(
    bootstrap_servers: Bootstrap = None,
    database_url: DatabaseUrl = None,
    host: Annotated[str | None, typer.Option(help="Listen address (TURNLOG_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (TURNLOG_API_PORT).")] = None,
) -> None:
    """Serve the HTTP API, the SSE live streams, the live transcript page (/live) and the operations page (/ops)."""
    import uvicorn

    from turnlog.api import create_app
    from turnlog.sinks import open_store

    settings = _service_settings(bootstrap_servers=bootstrap_servers, database_url=database_url, api_host=host,
                                 api_port=port)
    if not settings.api_tokens:
        logging.getLogger(__name__).warning("TURNLOG_API_TOKENS is empty: every API request will get 401")
    _opener(settings)  # the live hub opens sealed records: a bad keyring stops the API here
    store = open_store(settings.database_url)
    store.wait_for_schema()
    uvicorn.run(
        create_app(settings, store), host=settings.api_host, port=settings.api_port,
        log_level=settings.log_level.lower()
    )


@app.command()
def tail(
    session_id: Annotated[str, typer.Argument(help="The session to follow: its key ('<fleet>:<id>').")],
    after: Annotated[int, typer.Option(help="Start after this seq (-1: from the start).")] = -1,
    bootstrap_servers: Bootstrap = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Follow a session in the terminal: its stored turns, then live ones, until it ends (exit 0), or it is
    forgotten (exit 4: nothing more of it is shown)."""
    import asyncio

    from turnlog.ops.tail import tail_session
    from turnlog.sinks import open_store

    settings = _settings(bootstrap_servers=bootstrap_servers, database_url=database_url)
    store = open_store(settings.database_url)
    store.require_schema()
    result = asyncio.run(tail_session(settings, store, session_id, after))
    if not result.found:
        typer.echo(f"turnlog: no session {session_id!r} in the store", err=True)
        raise typer.Exit(1)
    if result.skipped:
        typer.echo(f"turnlog: skipped {result.skipped} events that could not be shown (see the warnings)", err=True)
    if result.erased:
        typer.echo(f"turnlog: session {session_id!r} is forgotten; the tail ends", err=True)
        raise typer.Exit(4)


@app.command()
def replay(
    database_url: DatabaseUrl = None,
    bootstrap_servers: Bootstrap = None,
    from_: Annotated[
        str, typer.Option("--from", help="Where to start: 'earliest' (the only position besides --from-time).")
    ] = "earliest",
    from_time: Annotated[
        str | None,
        typer.Option("--from-time", help="Start at the first record at or after this ISO 8601 time (UTC if no offset).")
    ] = None,
    session: Annotated[
        list[str] | None, typer.Option("--session", help="Replay only this session, by its key (repeatable).")
    ] = None,
) -> None:
    """Rebuild a store from <prefix>.events: sequence, write and finalize, as the live pipeline does."""
    import datetime as dt

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from turnlog.ops.replay import replay_events
    from turnlog.sinks import open_store

    if from_ != "earliest":
        typer.echo("turnlog: --from takes only 'earliest'; use --from-time for a time", err=True)
        raise typer.Exit(2)
    start: dt.datetime | None = None
    if from_time is not None:
        try:
            start = dt.datetime.fromisoformat(from_time)
        except ValueError:
            typer.echo(f"turnlog: --from-time {from_time!r} is not an ISO 8601 time", err=True)
            raise typer.Exit(2) from None
        start = start if start.tzinfo else start.replace(tzinfo=dt.UTC)
    settings = _settings(database_url=database_url, bootstrap_servers=bootstrap_servers)
    store = open_store(settings.database_url)
    store.upgrade_schema()
    columns = (TextColumn("replay {task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]:,.0f} records/s"), TimeRemainingColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(settings.topics.events, total=None, rate=0.0)
        began = time.monotonic()

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, rate=done / max(time.monotonic() - began, 1e-9))

        result = replay_events(settings, store, from_time=start, session_ids=session or (), progress=progress)
    typer.echo(
        f"replayed {result.records_read:,} records in {result.seconds:.1f} s ({result.rate:,.0f} records/s): "
        f"{result.events_applied:,} events applied, {result.duplicates:,} duplicates, {result.rejected:,} rejected, "
        f"{result.erased:,} of forgotten sessions skipped; "
        f"{result.sessions_seen} sessions ({result.sessions_settled} already settled, left alone), "
        f"{result.sessions_finalized} finalized"
    )
    for reason, count in sorted(result.rejected_reasons.items()):
        typer.echo(f"  rejected {count}: {reason}")
    if result.incomplete:
        shown = ", ".join(f"{sid} (waits for seq {seq}, {held} held)" for sid, seq, held in result.incomplete[:10])
        more = f" and {len(result.incomplete) - 10} more" if len(result.incomplete) > 10 else ""
        typer.echo(
            f"warning: {len(result.incomplete)} sessions left incomplete, their next seq is not in the replayed log "
            f"(the log starts after it: --from-time or retention): {shown}{more}",
            err=True,
        )


@app.command()
def verify(
    database_url: DatabaseUrl = None,
    against_url: Annotated[str | None, typer.Option("--against-url", help="Store B to compare with.")] = None,
    against_log: Annotated[
        bool, typer.Option("--against-log", help="Compare with a store rebuilt from <prefix>.events.")
    ] = False,
    bootstrap_servers: Bootstrap = None,
    session: Annotated[
        list[str] | None, typer.Option("--session", help="Compare only this session, by its key (repeatable).")
    ] = None,
) -> None:
    """Compare a store (A) with another store or with the log, session by session; exit 1 on any difference."""
    import tempfile

    from turnlog.ops.replay import replay_events
    from turnlog.ops.verify import compare_digests, erased_session_ids, session_digests
    from turnlog.sinks import open_store, safe_url

    if (against_url is None) == (not against_log):
        typer.echo("turnlog: give exactly one of --against-url DSN and --against-log", err=True)
        raise typer.Exit(2)
    settings = _settings(database_url=database_url, bootstrap_servers=bootstrap_servers)
    store_a = open_store(settings.database_url)
    store_a.require_schema()
    wanted = session or ()
    with tempfile.TemporaryDirectory(prefix="turnlog-verify-") as scratch:
        if against_url is not None:
            store_b = open_store(against_url)
            store_b.require_schema()
            label = safe_url(against_url)
        else:
            store_b = open_store(f"sqlite:///{scratch}/from-log.db")
            store_b.upgrade_schema()
            replayed = replay_events(settings, store_b, session_ids=wanted)
            label = f"{settings.topics.events} ({replayed.records_read:,} records replayed)"
        # A session forgotten in either store is left out of both: each holds nothing of it, or will.
        erased = erased_session_ids(store_a, wanted) | erased_session_ids(store_b, wanted)
        digests_a = {sid: d for sid, d in session_digests(store_a, wanted).items() if sid not in erased}
        digests_b = {sid: d for sid, d in session_digests(store_b, wanted).items() if sid not in erased}
        differences = compare_digests(digests_a, digests_b)
    typer.echo(f"A: {safe_url(settings.database_url)} ({len(digests_a)} sessions)")
    typer.echo(f"B: {label} ({len(digests_b)} sessions)")
    if erased:
        typer.echo(f"{len(erased)} forgotten sessions left out of the comparison")
    for difference in differences:
        typer.echo(f"  {difference.session_id}: {difference.what}")
    typer.echo(f"{len(differences)} differing sessions")
    raise typer.Exit(1 if differences else 0)


@app.command()
def bench(
    sessions: Annotated[
        Path, typer.Option("--sessions", help="Folder of <session>.jsonl transcripts.")
    ] = Path("data/sessions"),
    database_url: DatabaseUrl = None,
    bootstrap_servers: Bootstrap = None,
    concurrency: Annotated[int, typer.Option(help="Concurrent sessions of the workload.")] = 1000,
    turns: Annotated[int, typer.Option(help="Turns each session says before it ends and the next begins.")] = 40,
    phase_seconds: Annotated[float, typer.Option(help="Length of each load phase (seconds).")] = 30.0,
    speed: Annotated[
        float, typer.Option(help="Time compression of the replay (the rate is set by how many sessions run).")
    ] = 10.0,
    memory_sessions: Annotated[int, typer.Option(help="Open sessions added per memory step (two steps).")] = 5000,
    report: Annotated[Path | None, typer.Option("--report", help="Write every figure as JSON here.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the PNG plot here.")] = None,
    profile_dir: Annotated[
        Path | None,
        typer.Option("--profile-dir", help="Profile sequencer and sink with py-spy; collapsed stacks here.")
    ] = None,
    keep: Annotated[bool, typer.Option(help="Keep the run's database and topics.")] = False,
    direct: Annotated[
        bool, typer.Option(help="Also measure the direct peer (agents upserting straight into Postgres).")
    ] = True,
    direct_connections: Annotated[int, typer.Option(help="Connections the direct peer's agents share.")] = 16,
    transactions_repetitions: Annotated[
        int,
        typer.Option(min=0, help="Pairs of runs (sequencer transactions off, on) of the transactions phase; 0: none."),
    ] = 1,
    encryption_repetitions: Annotated[
        int,
        typer.Option(min=0, help="Pairs of runs (encryption off, on) of the encryption phase; 0: none."),
    ] = 1,
    tracing_repetitions: Annotated[
        int, typer.Option(min=1, help="Pairs of runs (tracing off, on) of the tracing phase (--only tracing).")
    ] = 1,
    only: Annotated[
        str | None,
        typer.Option("--only", help="Run one phase alone: 'transactions' (sequencer transactions on vs off),"
                     " 'encryption' (envelope encryption on vs off) or 'tracing' (traces, 10 % sampled, on vs off)."),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="Smoke test: every phase, cut short (figures not comparable with a full run).")
    ] = False,
) -> None:
    """Benchmark the pipeline on Postgres against baselines measured in the same run (see docs/benchmarks.md)."""
    from turnlog.sinks import parse_database_url
    from turnlog.tools.bench.options import BenchOptions, quick_options
    from turnlog.tools.bench.runner import run_bench

    settings = _settings(database_url=database_url, bootstrap_servers=bootstrap_servers)
    if parse_database_url(settings.database_url).get_backend_name() != "postgresql":
        typer.echo("turnlog: bench needs Postgres: --database-url postgresql+psycopg://... (its role must be able to"
                   " CREATE DATABASE)", err=True)
        raise typer.Exit(2)
    phases: dict[str | None, Literal["transactions", "encryption", "tracing"] | None] = {
        None: None, "transactions": "transactions", "encryption": "encryption", "tracing": "tracing"}
    if only not in phases:
        typer.echo(f"turnlog: bench --only takes 'transactions', 'encryption' or 'tracing', not {only!r}", err=True)
        raise typer.Exit(2)
    options = BenchOptions(
        sessions_dir=sessions, admin_url=settings.database_url, sessions=concurrency, turns_per_session=turns,
        phase_seconds=phase_seconds, speed=speed, memory_sessions=memory_sessions, report_path=report, plot_path=plot,
        profile_dir=profile_dir, keep=keep, direct=direct, direct_connections=direct_connections,
        transactions_repetitions=transactions_repetitions, encryption_repetitions=encryption_repetitions,
        tracing_repetitions=tracing_repetitions, only=phases[only],
    )
    run_bench(settings, quick_options(options) if quick else options)


@app.command("spool-drain")
def spool_drain(
    bootstrap_servers: Bootstrap = None,
    spool_dir: Annotated[
        Path | None,
        typer.Option("--spool-dir", envvar="TURNLOG_SPOOL_DIR", help="The recorders' spool folder on this host.")
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Longest wait for the broker to acknowledge everything (seconds).")
    ] = 300.0,
) -> None:
    """Deliver what dead recorders left in this host's spool folder (exit 1 if some is left).

    A recorder started on the host does the same by itself; this is for a host
    whose agents are not coming back (a drained node, a retired pod volume).
    """
    import asyncio

    from turnlog.producers import SessionRecorder

    settings = _settings(bootstrap_servers=bootstrap_servers, spool_dir=str(spool_dir) if spool_dir else None)
    # It delivers what dead recorders spooled (already redacted) and records nothing: no redactor to build.
    recorder = SessionRecorder(settings.model_copy(update={"spool_close_timeout_seconds": timeout, "redaction": "off"}),
                               producer_id="spool-drain")

    async def drain() -> int:
        await recorder.start()
        held = recorder.spooled_events()
        typer.echo(f"turnlog spool-drain: {held} undelivered events found in {settings.spool_dir}")
        await recorder.close()
        return recorder.spooled_events()

    left = asyncio.run(drain())
    typer.echo(f"turnlog spool-drain: {left} events left undelivered" if left else "turnlog spool-drain: all delivered")
    raise typer.Exit(1 if left else 0)


@app.command("replay-agent", hidden=True)
def replay_agent(
    transcript: Annotated[Path, typer.Argument(help="A sessions/*.jsonl file.")],
    session_id: Annotated[str, typer.Option(help="Session id to record under.")],
    speed: Annotated[float, typer.Option(help="Time compression factor.")] = 40.0,
    resume: Annotated[bool, typer.Option(help="Resume the session (new epoch) instead of starting it.")] = False,
    fleet: Annotated[str, typer.Option()] = "demo",
    base_time: Annotated[
        str, typer.Option(help="ISO timestamp of second 0 of the recording.")
    ] = "2026-01-01T00:00:00+00:00",
    latency_log: Annotated[
        Path | None, typer.Option(help="Append each complete_turn's start and duration here (JSON lines).")
    ] = None,
) -> None:
    """A simulated agent for the demo: replays one transcript through SessionRecorder."""
    import asyncio
    import datetime as dt

    from turnlog.tools.demo.agent import replay_transcript

    settings = _service_settings()  # the recorder's metrics (spool, degraded, resume) on TURNLOG_METRICS_PORT
    base = dt.datetime.fromisoformat(base_time)
    asyncio.run(
        replay_transcript(
            settings, transcript, session_id, speed=speed, base_time=base, resume=resume, fleet=fleet,
            latency_log=latency_log,
        )
    )


PrometheusTargets = Annotated[
    Path | None,
    typer.Option(
        "--prometheus-targets",
        help="A Prometheus file_sd folder (deploy/prometheus.sh: $TURNLOG_STATE_DIR/prometheus/targets): every"
        " service and agent gets a metrics port, all listed in one targets file there for the run's length.",
    ),
]


@app.command()
def demo(
    sessions: Annotated[
        Path, typer.Option("--sessions", help="Folder of <session>.jsonl transcripts.")
    ] = Path("data/sessions"),
    database_url: DatabaseUrl = None,
    bootstrap_servers: Bootstrap = None,
    report: Annotated[Path | None, typer.Option("--report", help="Write the per-session report as JSON here.")] = None,
    speed: Annotated[float, typer.Option(help="Time compression: input seconds per real second.")] = 40.0,
    kills: Annotated[int, typer.Option(help="Agents to SIGKILL mid-turn and resume.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed for choosing the killed agents and moments.")] = 7,
    timeout: Annotated[float, typer.Option(help="Longest wait for finalization after the replay (seconds).")] = 180.0,
    flush_interval: Annotated[float, typer.Option(help="Agents' partial flush timer (seconds, replay time).")] = 0.2,
    prometheus_targets: PrometheusTargets = None,
) -> None:
    """Replay real transcripts as concurrent agents, SIGKILL some mid-turn, resume them, verify the store."""
    from turnlog.tools.demo.runner import DemoOptions, run_demo

    settings = _settings(database_url=database_url, bootstrap_servers=bootstrap_servers)
    options = DemoOptions(
        sessions_dir=sessions, speed=speed, kills=kills, seed=seed, report_path=report, timeout=timeout,
        flush_interval_seconds=flush_interval, prometheus_targets=prometheus_targets,
    )
    ok = run_demo(settings, options)
    raise typer.Exit(0 if ok else 1)


@app.command()
def chaos(
    duration: Annotated[float, typer.Option(help="Seconds of workload under kills.")] = 300.0,
    seed: Annotated[int, typer.Option(help="Seed of the kill schedule.")] = 1,
    kills: Annotated[
        int, typer.Option(help="Kills over agents, sequencer, sink, finalizer (and the broker without --cluster).")
    ] = 25,
    sessions: Annotated[
        Path, typer.Option("--sessions", help="Folder of <session>.jsonl transcripts.")
    ] = Path("data/sessions"),
    database_url: DatabaseUrl = None,
    bootstrap_servers: Bootstrap = None,
    report: Annotated[Path | None, typer.Option("--report", help="Write the report as JSON here.")] = None,
    cluster: Annotated[
        bool,
        typer.Option(
            "--cluster",
            help="Run on the local 3-node cluster (started if down; RF 3, min ISR 2; 2 sequencer and 2 sink workers)"
            " with its faults: the busiest leader SIGKILLed, a rolling restart, a node SIGSTOPped, two nodes down,"
            " a worker SIGSTOPped past its session timeout.",
        ),
    ] = False,
    cluster_state_dir: Annotated[
        Path | None,
        typer.Option(
            help="With --cluster: the state root of a cluster of the run's own (TURNLOG_STATE_DIR of its"
            " deploy/kafka.sh; its ports from TURNLOG_KAFKA_CLUSTER_PORT and TURNLOG_KAFKA_CLUSTER_CONTROLLER_PORT)."
            " Default: TURNLOG_STATE_DIR, the cluster the tests use.",
        ),
    ] = None,
    prometheus_targets: PrometheusTargets = None,
    ops_port: Annotated[
        int | None,
        typer.Option(
            "--ops-port", min=1, max=65535,
            help="Serve `turnlog api` on this loopback port for the run, never killed: watch it on /ops with a"
            ' "*" token of TURNLOG_API_TOKENS (Prometheus figures with TURNLOG_OPS_PROMETHEUS_URL).',
        ),
    ] = None,
) -> None:
    """SIGKILL every component at random under the demo workload; report losses, duplicates, order, aggregates,
    recovery, and complete_turn latency per fault kind."""
    from turnlog.exceptions import ConfigurationError
    from turnlog.tools.demo.chaos import ChaosOptions, run_chaos

    # TURNLOG_BOOTSTRAP_SERVERS gives way to the cluster's servers; an explicit --bootstrap-servers is refused.
    if cluster and bootstrap_servers is not None and bootstrap_servers != os.environ.get("TURNLOG_BOOTSTRAP_SERVERS"):
        raise ConfigurationError("--cluster runs on the local cluster's servers; leave --bootstrap-servers out")
    if cluster_state_dir is not None and not cluster:
        raise ConfigurationError("--cluster-state-dir goes with --cluster")
    settings = _settings(database_url=database_url, bootstrap_servers=bootstrap_servers)
    ok = run_chaos(settings, ChaosOptions(sessions_dir=sessions, duration=duration, seed=seed, kills=kills,
                                          report_path=report, cluster=cluster, cluster_state_dir=cluster_state_dir,
                                          prometheus_targets=prometheus_targets, ops_port=ops_port))
    raise typer.Exit(0 if ok else 1)


def main() -> None:
    from turnlog.exceptions import TurnlogError

    try:
        app()
    except TurnlogError as e:  # a clear message, not a traceback, for errors turnlog names itself
        typer.echo(f"turnlog: {type(e).__name__}: {e}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
