"""Typed settings, read once from the environment (prefix ``TURNLOG_``).

Every setting is declared here once, with its type, default and meaning. A bad
value fails at start-up with pydantic's error naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, SecretStr, ValidatorFunctionWrapHandler, field_serializer, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "TurnlogSettings", "TopicNames", "load_settings", "KafkaSecurityProtocol", "KafkaSaslMechanism", "SECRET_SETTINGS",
    "MAX_RETENTION_DAYS", "is_fleet_name",
]

#: librdkafka's ``security.protocol`` values turnlog supports (Faust's aiokafka takes the same names).
KafkaSecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
#: ``sasl.mechanism`` values both clients (librdkafka and aiokafka) support with a username and password.
KafkaSaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
_SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})
_TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
#: Longest retention policy (days, ~100 years): a cutoff further back would not be a datetime.
MAX_RETENTION_DAYS = 36_500


def is_fleet_name(fleet: str) -> bool:
    """Whether ``fleet`` can name a fleet in settings keyed by fleet: the event schema's fleet
    names (1 to 200 characters, no NUL), and not ``'*'`` (every fleet, in api_tokens)."""
    return 1 <= len(fleet) <= 200 and "\x00" not in fleet and fleet != "*"


class TopicNames:
    """The topic names derived from a prefix: ``<prefix>.events`` and so on."""

    def __init__(self, prefix: str) -> None:
        self.events = f"{prefix}.events"
        self.transcript = f"{prefix}.transcript"
        self.dlq = f"{prefix}.dlq"
        #: the erasure ledger (compacted; docs/design.md, "Encryption and erasure")
        self.erasures = f"{prefix}.erasures"

    def all(self) -> tuple[str, str, str, str]:
        return (self.events, self.transcript, self.dlq, self.erasures)


class TurnlogSettings(BaseSettings):
    """All of turnlog's configuration. Environment names are ``TURNLOG_<FIELD>``."""

    # Inputs stay out of validation errors: a failing model check would print every
    # value given, secrets (kafka_sasl_password, api_token) included.
    model_config = SettingsConfigDict(env_prefix="TURNLOG_", frozen=True, extra="ignore", hide_input_in_errors=True)

    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers, comma separated host:port."
    )
    kafka_security_protocol: KafkaSecurityProtocol = Field(
        "PLAINTEXT",
        description="How every Kafka client connects: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL "
        "(SASL over TLS). The SASL ones need kafka_sasl_mechanism, kafka_sasl_username and kafka_sasl_password.",
    )
    kafka_sasl_mechanism: KafkaSaslMechanism | None = Field(
        None, description="SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (SASL protocols only)."
    )
    kafka_sasl_username: str | None = Field(None, description="SASL username (SASL protocols only).")
    kafka_sasl_password: SecretStr | None = Field(
        None, description="SASL password (SASL protocols only); never logged or shown in a repr."
    )
    kafka_ssl_ca_location: str | None = Field(
        None,
        description="PEM file of the CA that signed the brokers' certificates (TLS protocols only; unset: "
        "the system's trust store).",
    )
    kafka_ssl_certificate_location: str | None = Field(
        None, description="PEM file of this client's certificate, for mutual TLS (needs kafka_ssl_key_location)."
    )
    kafka_ssl_key_location: str | None = Field(
        None,
        description="PEM file of this client's private key, for mutual TLS (needs kafka_ssl_certificate_location)."
    )
    kafka_ssl_key_password: SecretStr | None = Field(
        None, description="Password of kafka_ssl_key_location, if the key is encrypted; never logged."
    )
    database_url: SecretStr = Field(
        SecretStr("sqlite:///turnlog.db"),
        description="SQLAlchemy URL of the store: sqlite:///PATH (WAL mode, the embedded "
        "default) or postgresql+psycopg://user:pass@host:port/db. It may hold the password, so it is "
        "never shown in a repr, a dump or an error; messages name it through turnlog.redact.redact_url.",
    )
    topic_prefix: str = Field(
        "turnlog", description="Topics are <prefix>.events, <prefix>.transcript, <prefix>.dlq."
    )
    partitions: int = Field(
        6, ge=1, description="Partition count shared by the co-partitioned topics (set once)."
    )
    replication_factor: int | None = Field(
        None,
        ge=1,
        description="Replication factor of every topic turnlog or Faust creates (turnlog's and Faust's changelog "
        "and assignor topics). Unset: min(3, live brokers), from the cluster's metadata when the topics are created "
        "or checked and when a Faust worker starts (turnlog/kafka/replication.py).",
    )
    min_insync_replicas: int | None = Field(
        None,
        ge=1,
        description="min.insync.replicas set on every topic turnlog or Faust creates: a write (acks=all) needs this "
        "many replicas in sync. Unset: the replication factor less one, at least 1. Never above the replication "
        "factor, and below it when the factor is above 1 (turnlog topics create refuses otherwise).",
    )
    events_retention_ms: int = Field(
        30 * 24 * 3600 * 1000,
        ge=-1,
        description="retention.ms of <prefix>.events (milliseconds; -1 keeps forever). "
        "The store can be rebuilt from the log only as far back as this.",
    )
    transcript_retention_ms: int = Field(
        7 * 24 * 3600 * 1000, ge=-1, description="retention.ms of <prefix>.transcript (ms)."
    )
    dlq_retention_ms: int = Field(
        30 * 24 * 3600 * 1000, ge=-1, description="retention.ms of <prefix>.dlq (ms)."
    )
    flush_interval_seconds: float = Field(
        5.0,
        gt=0,
        description="Recorder timer: the in-progress partial is flushed this often (seconds). "
        "Bounds what a SIGKILL can lose of an unfinished turn.",
    )
    max_text_bytes: int = Field(
        65_536, ge=1, le=262_144, description="Largest turn text the recorder accepts (UTF-8 bytes)."
    )
    redaction: Literal["off", "patterns", "presidio"] = Field(
        "off",
        description="What the recorder masks in turn text and tool-call values before it spools them "
        "(turnlog/producers/pii.py). off: nothing. patterns: emails, phone numbers, card numbers (Luhn) and IBANs "
        "(mod 97) as [EMAIL], [PHONE], [CARD], [IBAN]. presidio: those, then Presidio's pattern recognizers, "
        "offline (needs turnlog[presidio]). Lossy: what resume() gives back to the agent is the masked text.",
    )
    delivery_timeout_seconds: float = Field(
        120.0,
        gt=0,
        description="How long a producer retries one record before reporting it failed (seconds). The recorder "
        "then sends it again from its spool; the services' producers fail the batch. Longer than a failover "
        "on a replicated cluster (a leader election or a controller move took ~50 s on the local 3-node "
        "cluster), so none gives up inside one.",
    )
    spool_dir: str = Field(
        ".turnlog-spool",
        description="Folder of the recorder's durable local spool (one SQLite file per recorder). It must "
        "outlive the agent process (in a container: a volume kept across restarts, one per host or pod), "
        "because a recorder started later here delivers what a dead one left behind.",
    )
    spool_max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Most bytes of events the spool holds undelivered; past it the recorder raises "
        "SpoolFullError (bytes).",
    )
    ack_wait_seconds: float = Field(
        1.0,
        gt=0,
        description="Longest complete_turn waits for the broker's acknowledgement before it returns on the "
        "spool's fsync alone and the recorder runs degraded (seconds).",
    )
    spool_close_timeout_seconds: float = Field(
        90.0,
        ge=0,
        description="Longest SessionRecorder.close() waits for the spool to drain (seconds): longer than a "
        "cluster's failover. What is left stays in the spool for the next recorder started with the same "
        "spool_dir (or `turnlog spool-drain`).",
    )
    sequencer_group: str = Field("turnlog-sequencer", description="Consumer group (Faust app id) of the sequencer.")
    sink_group: str = Field("turnlog-sink", description="Consumer group of the SQL sink.")
    analytics_group: str = Field("turnlog-analytics", description="Consumer group of the analytics projection.")
    finalizer_group: str = Field("turnlog-finalizer", description="Consumer group (Faust app id) of the finalizer.")
    reorder_buffer_size: int = Field(
        1024, ge=1, description="Events the sequencer buffers per session while waiting for a missing seq."
    )
    reorder_buffer_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1,
        description="Bytes of events (their sizes in the log) the sequencer buffers per session while waiting for "
        "a missing seq; it keeps their positions, and reads them again from the log when the gap fills.",
    )
    sequencer_transactions: bool = Field(
        True,
        description="Write what the sequencer's batch emits for an events partition (transcript records, DLQ "
        "records, session states) in one Kafka transaction, with one transactional.id per events partition: a "
        "worker that lost the partition while it was frozen (a zombie) is fenced and stops. Off: one idempotent "
        "producer, unfenced (a zombie's stale session states can stall its sessions).",
    )
    producer_linger_ms: int = Field(
        5,
        ge=0,
        le=1000,
        description="How long the sequencer's and finalizer's producers wait to fill a batch (milliseconds). "
        "Adds at most this to the turn-to-durable latency; saves a produce request per record.",
    )
    sink_batch_size: int = Field(500, ge=1, description="Most events the sink writes in one transaction.")
    sink_batch_wait_seconds: float = Field(
        0.002,
        gt=0,
        description="Longest one sink poll waits to fill a batch (seconds): a completed turn waits at most "
        "this long for company before its commit.",
    )
    sink_max_poll_interval_seconds: float = Field(
        300.0,
        ge=10,
        description="Longest the sink may go without polling before it leaves its consumer group (seconds; "
        "librdkafka's max.poll.interval.ms). A store outage does not count: the sink polls, paused, meanwhile.",
    )
    sink_partial_wait_seconds: float = Field(
        1.0,
        ge=0,
        description="Longest a batch holding only partials waits for more before its commit (seconds). Partials "
        "are durable in Kafka once acked; this only delays their row and keeps commits per turn <= 1.",
    )
    finalizer_sweep_seconds: float = Field(
        2.0,
        gt=0,
        description="How often the finalizer sweeps for ended, complete sessions not yet finalized (seconds); "
        "the sink finalizes sessions in its batches, the sweep catches what a store holds otherwise.",
    )
    resume_timeout_seconds: float = Field(
        120.0, gt=0, description="Longest resume() waits at the resume barrier (seconds)."
    )
    api_url: str | None = Field(
        None,
        description="Base URL of turnlog's HTTP API, e.g. http://127.0.0.1:8000 (no path). When set, "
        "SessionRecorder.resume() passes the resume barrier through the API (POST "
        "/api/sessions/{id}/resume) and needs no database credentials on the agent's host; unset: "
        "resume() needs a resume source given to the recorder (StoreResumeSource on a host that "
        "holds the store).",
    )
    api_token: SecretStr | None = Field(
        None,
        description="The recorder's bearer token for api_url: one of the API's TURNLOG_API_TOKENS whose "
        "fleets include the sessions it resumes.",
    )
    fleet_keys: dict[str, SecretStr | list[SecretStr]] = Field(
        default_factory=dict,
        repr=False,
        description="Write-side isolation: each fleet's record signing key, as JSON {fleet: key} (at least 32 "
        "bytes each, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`), or {fleet: [new key, "
        "old key, ...]} while rotating (the first signs, any verifies). Every key is distinct. A recorder holds the "
        "keys of the fleets it records and signs every event; the sequencer holds every fleet's key and sends "
        "unsigned, wrongly signed or other fleets' records to the DLQ (turnlog/signing.py). Empty: records are "
        "not signed and any writer of the events topic can write any session (open mode, a warning at start).",
    )
    insecure_open_fleets: bool = Field(
        False,
        description="Run the sequencer (and replay) without fleet keys: records are not authenticated and any "
        "writer of the events topic can write, fence or take over any session. Off by default: with no "
        "fleet_keys they refuse to start. Even open, a record claiming another fleet than its session's is "
        "refused and, with epoch_grant_key, an epoch nobody issued is refused.",
    )
    epoch_grant_key: SecretStr | None = Field(
        None,
        description="Key that signs epoch grants (at least 32 bytes): a resume claim (the API, or a recorder "
        "resuming through database_url) signs the epoch it issues, and the sequencer admits an epoch above 0 "
        "only with such a grant. Required wherever fleet_keys is set and resumes are granted or checked.",
    )
    erasure_issuer: str = Field(
        "turnlog",
        description="This host's name as an erasure issuer (1 to 64 bytes, no ':'): it signs the erasure "
        "ledger records this host writes (turnlog forget, the API, the sink's retention sweep) with "
        "erasure_issuer_key, and their requested_by reads '<issuer>:<who>'.",
    )
    erasure_issuer_key: SecretStr | None = Field(
        None,
        repr=False,
        description="Private Ed25519 key (32 bytes, base64url; `turnlog keys erasure-issuer` makes a pair) that "
        "signs the erasure ledger records this host writes. Held only where erasures are issued: the CLI's "
        "host, the API, the transcript sink. Unset: records go out unsigned, which readers with "
        "erasure_issuers set refuse.",
    )
    erasure_issuers: dict[str, str] = Field(
        default_factory=dict,
        description="The erasure issuers readers trust, as JSON {issuer: public key (base64url)}. Set: every "
        "reader of the erasure ledger (the sink, the analytics projection, recorders, the live hub, replay, "
        "verify) acts only on a record signed by one of them (the sink sends any other to the DLQ). Empty: "
        "unsigned records are taken (open mode; anyone who can write the erasures topic can erase).",
    )
    encryption: Literal["auto", "required", "off"] = Field(
        "auto",
        description="Envelope encryption of event content (turnlog/crypto; docs/design.md, 'Encryption and "
        "erasure'). auto: a recorder seals content when it has a KEK (kek_public_key, or the public half of "
        "keyring_file), and readers open sealed events with keyring_file. required: as auto, and a recorder "
        "without a KEK or a reader without a keyring refuses to start. off: recorders never seal (readers still "
        "open what they can).",
    )
    kek_public_key: str | None = Field(
        None,
        description="The current key encryption key's public half, x25519:<base64url> (`turnlog keys public`): "
        "what agents' recorders wrap each session epoch's data key with. It opens nothing.",
    )
    keyring_file: str | None = Field(
        None,
        description="The KEK keyring (private keys, newest first; mode 0600, `turnlog keys init`): held by the "
        "sink, the API, replay, verify and tail, which open sealed content. Never give it to agents.",
    )
    keyring: SecretStr | None = Field(
        None,
        repr=False,
        description="The keyring's text itself (its lines: x25519-private:..., newest first), for secrets "
        "injected as environment variables; instead of keyring_file, never with it.",
    )
    erasure_deadline_days: float = Field(
        30.0,
        gt=0,
        le=MAX_RETENTION_DAYS,  # also refuses inf and NaN, which no retention.ms could say
        description="Longest any copy of a forgotten session may outlive its erasure (days): the wrapped data "
        "keys travel in the log, so every topic's retention must be at most this; `turnlog topics check` warns "
        "otherwise. Also max.compaction.lag.ms of <prefix>.erasures.",
    )
    retention_days: float | None = Field(
        None,
        gt=0,
        le=MAX_RETENTION_DAYS,
        description="Forget finalized and abandoned sessions that ended longer ago than this (days), by the sink's "
        "retention sweep (or `turnlog retention-sweep`). Unset: keep them until forgotten on request.",
    )
    retention_days_by_fleet: dict[str, float] = Field(
        default_factory=dict,
        description="Per-fleet retention (days) as JSON {fleet: days}, over retention_days for those fleets "
        f"(each above 0, at most {MAX_RETENTION_DAYS}).",
    )
    faust_data_dir: str = Field(
        ".turnlog-faust", description="Folder for Faust's local table files (one subfolder per app)."
    )
    log_level: str = Field("INFO", description="Python logging level for the CLI's services.")
    api_tokens: dict[str, list[str]] = Field(
        default_factory=dict,
        repr=False,
        description="Bearer tokens of the HTTP API, as JSON: {token: [fleet, ...]}; the fleet '*' is every "
        "fleet. A token reads only its fleets' sessions. Empty: the API refuses every request.",
    )
    api_host: str = Field("127.0.0.1", description="Address `turnlog api` listens on.")
    api_port: int = Field(8000, ge=1, le=65535, description="Port `turnlog api` listens on.")
    api_poll_seconds: float = Field(
        1.0,
        gt=0,
        description="A live stream with nothing new from the transcript topic re-reads the store this often "
        "(seconds): the safety net under the topic's fast path.",
    )
    api_resume_workers: int = Field(
        8,
        ge=1,
        le=256,
        description="Resume barriers the API runs at once (each holds a thread until its session passed the barrier "
        "or its timeout). More requests wait for a worker, within their own timeout.",
    )
    api_resume_per_token: int = Field(
        2,
        ge=1,
        description="Resumes one API token may have running or waiting at once; past it the API answers 429 with "
        "Retry-After, so one token cannot hold every resume worker (at most api_resume_workers).",
    )
    api_max_streams: int = Field(
        256, ge=1, description="Live event streams (SSE followers) the API serves at once; past it: 429."
    )
    api_max_streams_per_token: int = Field(
        16,
        ge=1,
        description="Live event streams one API token may hold open at once; past it: 429 (at most api_max_streams).",
    )
    api_stream_queue_bytes: int = Field(
        1024 * 1024,
        ge=64 * 1024,
        description="Bytes of live events one stream may hold for a client that reads slower than its session "
        "writes; past it the stream ends with a stream.cutoff event naming the last event sent, and the client "
        "reconnects with Last-Event-ID (bytes).",
    )
    api_stream_send_timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="A live stream whose client accepts nothing for this long (one event or keep-alive write "
        "stalls) is closed (seconds).",
    )
    api_page_bytes: int = Field(
        4 * 1024 * 1024,
        ge=64 * 1024,
        le=64 * 1024 * 1024,
        description="Most bytes of turn text and tool calls, session metadata or event payloads in one API page "
        "(a transcript page, the turns of a resume grant, a page of sessions or stored events); a page holds at "
        "least one item whatever its size (bytes).",
    )
    api_docs: bool = Field(
        False,
        description="Serve the API's OpenAPI schema and its browsable docs (/openapi.json, /docs, /redoc) without a "
        "token. Off: they do not exist (404).",
    )
    ops_prometheus_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s]+$",
        max_length=2000,
        description="The Prometheus server (http or https base URL, e.g. http://prometheus:9090) the API's "
        "operations page (/ops) asks for turn-to-store percentiles, DLQ records by reason, degraded recorders and "
        "spool fullness, with fixed queries. Unset: the page shows those as not configured.",
    )
    ops_refresh_seconds: float = Field(
        2.0,
        ge=0.5,
        le=60.0,
        description="How often the operations page's figures (/api/ops) are read from Kafka, the store and "
        "Prometheus, at most: one read per interval shared by every client (seconds).",
    )
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="Serve Prometheus metrics on this port (services only; unset: off)."
    )
    lag_refresh_seconds: float = Field(
        15.0,
        ge=1.0,
        le=600.0,
        description="How often `turnlog lag-exporter` reads the consumer groups' lag (seconds); also the longest "
        "one read may take. Scrapes in between are served the last read.",
    )
    tracing: bool = Field(
        False,
        description="Export OpenTelemetry traces of each turn (recorder, sequencer, sink, finalizer; "
        "turnlog/tracing.py) by OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (OTel's own variables; default "
        "http://localhost:4318). Needs turnlog[otel]: a service refuses to start without it. Off: no span, no "
        "header.",
    )
    trace_sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="With tracing on, the share of turns traced (0..1): the recorder samples each turn's trace "
        "by its trace id; the sequencer and the sink follow the turn's decision (parent-based).",
    )
    ready_file: Path | None = Field(
        None,
        description="A service (sequencer, finalizer, sink, analytics, api) writes this file when it is ready "
        "and removes it when it is not (a rebalance) or stops: one JSON object {component, pid, ready_at "
        "(Unix seconds)}, replaced atomically (turnlog/readiness.py). Its folder must exist. Unset: no file. "
        "The process runner (deploy/processes.py) sets it per service.",
    )

    @field_validator("topic_prefix")
    @classmethod
    def _topic_prefix_is_legal(cls, value: str) -> str:
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        if not value or not set(value) <= allowed:
            raise ValueError("topic_prefix may use only letters, digits, '.', '_' and '-'")
        return value

    @model_validator(mode="after")
    def _api_settings_are_consistent(self) -> TurnlogSettings:
        """Every API token names at least one fleet (a token that grants nothing is a configuration
        error, not a harmless entry: it could still make the API work for it), and the per-token limits
        fit inside the global ones. Errors name a token by its position, never the token itself."""
        tokens = self.api_tokens
        for position, (token, fleets) in enumerate(tokens.items(), start=1):
            where = f"api_tokens: token #{position} of {len(tokens)}"
            if not token.strip():
                raise ValueError(f"{where} is empty")
            if token != token.strip():
                raise ValueError(f"{where} starts or ends with whitespace")
            if not fleets:
                raise ValueError(f"{where} has no fleets (give at least one fleet, or '*' for every fleet)")
            if any(not fleet.strip() for fleet in fleets):
                raise ValueError(f"{where} names an empty fleet")
        if self.api_resume_per_token > self.api_resume_workers:
            raise ValueError("api_resume_per_token is larger than api_resume_workers")
        if self.api_max_streams_per_token > self.api_max_streams:
            raise ValueError("api_max_streams_per_token is larger than api_max_streams")
        return self

    @field_validator("api_url")
    @classmethod
    def _api_url_is_http(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1]) == 0:
            raise ValueError("api_url must be an http:// or https:// URL, e.g. http://127.0.0.1:8000")
        return value

    @field_validator("api_tokens", mode="wrap")
    @classmethod
    def _api_tokens_errors_name_no_token(cls, value: object, handler: ValidatorFunctionWrapHandler) -> object:
        """A bad api_tokens fails naming the setting only: pydantic's own error would name the
        bad entry by its key, and the keys are the tokens."""
        try:
            return handler(value)
        except ValueError:  # pydantic's ValidationError is a ValueError
            raise ValueError("api_tokens must be a JSON object {token: [fleet, ...]} of strings") from None

    @field_serializer("api_tokens")
    def _api_tokens_hidden(self, tokens: dict[str, list[str]]) -> dict[str, list[str]]:
        """In a dump (``model_dump``, ``model_dump_json``) each token shows as ``<token N>``, its fleets
        as they are; :meth:`as_environment` reads the field itself."""
        return {f"<token {number}>": fleets for number, fleets in enumerate(tokens.values(), 1)}

    @model_validator(mode="after")
    def _kafka_security_is_complete(self) -> TurnlogSettings:
        """Fail at load on a security setup the clients would only reject at their first connection."""
        protocol = self.kafka_security_protocol
        sasl = {
            "kafka_sasl_mechanism": self.kafka_sasl_mechanism,
            "kafka_sasl_username": self.kafka_sasl_username,
            "kafka_sasl_password": self.kafka_sasl_password,
        }
        if protocol in _SASL_PROTOCOLS:
            missing = [name for name, value in sasl.items() if not value]
            if missing:
                raise ValueError(f"kafka_security_protocol={protocol} needs {', '.join(missing)}")
        else:
            stray = [name for name, value in sasl.items() if value is not None]
            if stray:
                raise ValueError(f"{', '.join(stray)} set, but kafka_security_protocol={protocol} uses no SASL")
        tls_files = {
            "kafka_ssl_ca_location": self.kafka_ssl_ca_location,
            "kafka_ssl_certificate_location": self.kafka_ssl_certificate_location,
            "kafka_ssl_key_location": self.kafka_ssl_key_location,
        }
        if protocol not in _TLS_PROTOCOLS:
            tls_values = {**tls_files, "kafka_ssl_key_password": self.kafka_ssl_key_password}
            stray = [name for name, value in tls_values.items() if value is not None]
            if stray:
                raise ValueError(f"{', '.join(stray)} set, but kafka_security_protocol={protocol} uses no TLS")
        if (self.kafka_ssl_certificate_location is None) != (self.kafka_ssl_key_location is None):
            raise ValueError("kafka_ssl_certificate_location and kafka_ssl_key_location go together (mutual TLS)")
        if self.kafka_ssl_key_password is not None and self.kafka_ssl_key_location is None:
            raise ValueError("kafka_ssl_key_password set without kafka_ssl_key_location")
        for name, location in tls_files.items():
            if location is not None and not Path(location).is_file():
                raise ValueError(f"{name}: no such file: {location}")
        return self

    @field_validator("retention_days_by_fleet")
    @classmethod
    def _retention_by_fleet_is_valid(cls, value: dict[str, float]) -> dict[str, float]:
        """Every key is a fleet name (the schema's rule, as for fleet_keys) and every value a number
        of days in (0, MAX_RETENTION_DAYS]: 0 or less would forget each session as it settles."""
        for fleet, days in value.items():
            if not is_fleet_name(fleet):
                raise ValueError(f"retention_days_by_fleet names an invalid fleet {fleet[:40]!r}")
            if not 0 < days <= MAX_RETENTION_DAYS:  # NaN fails this too
                raise ValueError(f"retention_days_by_fleet[{fleet!r}] must be above 0 and at most "
                                 f"{MAX_RETENTION_DAYS} days")
        return value

    @model_validator(mode="after")
    def _signing_keys_are_strong(self) -> TurnlogSettings:
        """Fail at load on a key too short to sign with (the error names the fleet, never the key)."""
        from turnlog.signing import MIN_KEY_BYTES

        named: dict[str, SecretStr] = {}
        for fleet, keys in self._fleet_key_lists().items():
            if not is_fleet_name(fleet):
                raise ValueError(f"fleet_keys names an invalid fleet {fleet[:40]!r}")
            if not keys:
                raise ValueError(f"fleet_keys[{fleet!r}] has no key")
            named.update({f"fleet_keys[{fleet!r}][{i}]": key for i, key in enumerate(keys)})
        if self.epoch_grant_key is not None:
            named["epoch_grant_key"] = self.epoch_grant_key
        seen: dict[str, str] = {}
        for name, key in named.items():
            value = key.get_secret_value()
            if len(value.encode("utf-8")) < MIN_KEY_BYTES:
                raise ValueError(f"{name} is shorter than {MIN_KEY_BYTES} bytes")
            if value in seen:  # a shared key would let one fleet sign as another, or mint epochs
                raise ValueError(f"{name} is the same key as {seen[value]}; every key must be distinct")
            seen[value] = name
        return self

    @model_validator(mode="after")
    def _one_keyring(self) -> TurnlogSettings:
        if self.keyring is not None and self.keyring_file is not None:
            raise ValueError("keyring and keyring_file both set: give the readers' keyring one way")
        return self

    def fleet_key_rings(self) -> dict[str, list[str]]:
        """``fleet_keys`` unwrapped, each as a ring (the signing key first), for
        :class:`turnlog.signing.RecordSigner` and ``RecordVerifier``."""
        return {fleet: [key.get_secret_value() for key in keys] for fleet, keys in self._fleet_key_lists().items()}

    def _fleet_key_lists(self) -> dict[str, list[SecretStr]]:
        """``fleet_keys`` with each fleet's key or ring as a list (the signing key first)."""
        return {fleet: [ring] if isinstance(ring, SecretStr) else ring for fleet, ring in self.fleet_keys.items()}

    @property
    def topics(self) -> TopicNames:
        # Not cached: ``model_copy(update={"topic_prefix": ...})`` copies a cached value with the old prefix.
        return TopicNames(self.topic_prefix)

    def as_environment(self) -> dict[str, str]:
        """These settings as ``TURNLOG_*`` variables, for a child process: the values themselves,
        secrets included (a dump would hide them)."""
        values = {name: getattr(self, name) for name in type(self).model_fields}
        return {
            f"TURNLOG_{name.upper()}": _environment_value(value)
            for name, value in values.items()
            if value is not None
        }


def _holds_secret(annotation: object) -> bool:
    return annotation is SecretStr or any(_holds_secret(arg) for arg in get_args(annotation))


#: The settings whose values are secrets, never to be printed, not even in an error: every one typed
#: with ``SecretStr`` (also inside a dict or an Optional), and ``api_tokens``, whose keys are the tokens.
SECRET_SETTINGS: frozenset[str] = frozenset(
    {"api_tokens", *(name for name, field in TurnlogSettings.model_fields.items() if _holds_secret(field.annotation))}
)


def _environment_value(value: object) -> str:
    if isinstance(value, SecretStr):  # the child needs the secret itself, not its mask
        return value.get_secret_value()
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=lambda v: v.get_secret_value() if isinstance(v, SecretStr) else str(v))
    return str(value)


def load_settings(**overrides: Any) -> TurnlogSettings:
    """Settings from the environment, with explicit keyword overrides on top."""
    return TurnlogSettings(**{k: v for k, v in overrides.items() if v is not None})
