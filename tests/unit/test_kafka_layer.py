"""The Kafka layer without a broker: config mapping, secrets, validation, error conversion, retries."""

from __future__ import annotations

import datetime as dt
import logging
import ssl
from types import ModuleType

import faust
import pytest
from confluent_kafka import KafkaError, KafkaException
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

import turnlog.kafka as kafka
from turnlog.exceptions import ConfigurationError, TurnlogError
from turnlog.kafka.faust_auth import faust_credentials
from turnlog.kafka.offsets import LOOKUP_ATTEMPTS, lookup_retry
from turnlog.settings import TurnlogSettings

PASSWORD = "s3cret-sasl-pw"
KEY_PASSWORD = "s3cret-key-pw"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A self-signed CA certificate and a client certificate with an encrypted key (PEM files)."""
    folder = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "turnlog-test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (folder / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "client.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "client.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
        )
    )
    return {name: str(folder / name) for name in ("ca.pem", "client.pem", "client.key")}


def sasl(protocol: str = "SASL_PLAINTEXT", **more: object) -> TurnlogSettings:
    return TurnlogSettings(
        **{"bootstrap_servers": "broker-1:9093,broker-2:9093", **more},
        kafka_security_protocol=protocol,
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="agent",
        kafka_sasl_password=PASSWORD,
    )


def mutual_tls(tls_files, protocol: str = "SSL", **more: object) -> dict[str, object]:
    return dict(
        kafka_security_protocol=protocol,
        kafka_ssl_ca_location=tls_files["ca.pem"],
        kafka_ssl_certificate_location=tls_files["client.pem"],
        kafka_ssl_key_location=tls_files["client.key"],
        kafka_ssl_key_password=KEY_PASSWORD,
        **more,
    )


# --- config mapping, one protocol at a time ---------------------------------------------------


def test_plaintext_carries_only_the_servers_and_the_protocol():
    config = kafka.client_config(TurnlogSettings(bootstrap_servers="127.0.0.1:9092"))
    assert config == {"bootstrap.servers": "127.0.0.1:9092", "security.protocol": "PLAINTEXT"}


def test_ssl_maps_the_tls_files(tls_files):
    config = kafka.client_config(TurnlogSettings(**mutual_tls(tls_files)))
    assert config == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "SSL",
        "ssl.ca.location": tls_files["ca.pem"],
        "ssl.certificate.location": tls_files["client.pem"],
        "ssl.key.location": tls_files["client.key"],
        "ssl.key.password": KEY_PASSWORD,
    }


def test_sasl_plaintext_maps_the_credentials():
    config = kafka.client_config(sasl())
    assert config == {
        "bootstrap.servers": "broker-1:9093,broker-2:9093",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "agent",
        "sasl.password": PASSWORD,
    }


def test_sasl_ssl_maps_credentials_and_ca(tls_files):
    config = kafka.client_config(sasl("SASL_SSL", kafka_ssl_ca_location=tls_files["ca.pem"]))
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.password"] == PASSWORD
    assert config["ssl.ca.location"] == tls_files["ca.pem"]


def test_every_client_config_is_a_fresh_copy():
    settings = TurnlogSettings()
    first = kafka.client_config(settings)
    first["bootstrap.servers"] = "elsewhere:1"
    assert kafka.client_config(settings)["bootstrap.servers"] == "127.0.0.1:9092"


def test_producer_config_keeps_the_design_settings_and_the_connection():
    config = kafka.producer_config(sasl(), client_id="recorder-1", delivery_timeout_seconds=2.5)
    assert config["enable.idempotence"] is True
    assert config["acks"] == "all"
    assert config["partitioner"] == "murmur2_random"
    assert config["compression.type"] == "lz4"
    assert config["linger.ms"] == 5
    assert config["delivery.timeout.ms"] == 2500
    assert config["client.id"] == "recorder-1"
    assert config["sasl.password"] == PASSWORD
    assert "enable.idempotence" not in kafka.producer_config(sasl(), client_id="x", idempotent=False)
    assert kafka.producer_config(TurnlogSettings(delivery_timeout_seconds=7), client_id="x")["delivery.timeout.ms"] == 7000


def test_factories_make_clients_without_a_broker():
    settings = TurnlogSettings(bootstrap_servers="127.0.0.1:1")
    kafka.consumer(settings, group_id="unit", **{"auto.offset.reset": "earliest"}).close()
    kafka.producer(settings, client_id="unit").flush(0)
    kafka.admin(settings)


def test_faust_gets_the_same_connection(tls_files):
    assert faust_credentials(TurnlogSettings()) is None
    ssl_only = faust_credentials(TurnlogSettings(**mutual_tls(tls_files)))
    assert isinstance(ssl_only, faust.SSLCredentials)
    assert isinstance(ssl_only.context, ssl.SSLContext) and ssl_only.context.verify_mode == ssl.CERT_REQUIRED
    plain = faust_credentials(sasl())
    assert isinstance(plain, faust.SASLCredentials)
    assert (plain.protocol.value, plain.mechanism.value, plain.username, plain.password) == (
        "SASL_PLAINTEXT", "SCRAM-SHA-512", "agent", PASSWORD
    )
    over_tls = faust_credentials(sasl("SASL_SSL", kafka_ssl_ca_location=tls_files["ca.pem"]))
    assert over_tls.protocol.value == "SASL_SSL" and over_tls.ssl_context is not None


# --- secrets ----------------------------------------------------------------------------------


def test_secrets_stay_out_of_repr_str_and_dumps(tls_files):
    settings = sasl("SASL_SSL", kafka_ssl_ca_location=tls_files["ca.pem"])
    tls = TurnlogSettings(**mutual_tls(tls_files))
    for shown in (repr(settings), str(settings), repr(tls), str(tls), settings.model_dump_json(), tls.model_dump_json()):
        assert PASSWORD not in shown and KEY_PASSWORD not in shown
    assert PASSWORD not in repr(faust_credentials(settings))


def test_a_child_process_still_gets_the_secret():
    assert sasl().as_environment()["TURNLOG_KAFKA_SASL_PASSWORD"] == PASSWORD


def test_secrets_stay_out_of_the_logs(caplog, tls_files):
    caplog.set_level(logging.DEBUG)
    settings = sasl("SASL_SSL", kafka_ssl_ca_location=tls_files["ca.pem"], bootstrap_servers="127.0.0.1:1")
    consumer = kafka.consumer(settings, group_id="unit", **{"debug": "security"})
    consumer.poll(0.2)
    consumer.close()
    assert PASSWORD not in caplog.text


def test_secrets_stay_out_of_validation_errors():
    with pytest.raises(ValidationError) as raised:
        TurnlogSettings(kafka_security_protocol="SASL_SSL", kafka_sasl_password=PASSWORD)
    assert PASSWORD not in str(raised.value)


# --- validation at load -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"kafka_security_protocol": "SASL_SSL"}, "kafka_sasl_mechanism, kafka_sasl_username, kafka_sasl_password"),
        (
            {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN", "kafka_sasl_password": "x"},
            "kafka_sasl_username",
        ),
        ({"kafka_sasl_username": "agent"}, "kafka_sasl_username set, but kafka_security_protocol=PLAINTEXT"),
        ({"kafka_ssl_ca_location": "/etc/hosts"}, "kafka_ssl_ca_location set, but kafka_security_protocol=PLAINTEXT"),
        ({"kafka_security_protocol": "SSL", "kafka_ssl_ca_location": "/no/such/ca.pem"}, "kafka_ssl_ca_location: no such file"),
        ({"kafka_security_protocol": "SSL", "kafka_ssl_certificate_location": "/etc/hosts"}, "go together"),
        ({"kafka_security_protocol": "SSL", "kafka_ssl_key_password": "x"}, "kafka_ssl_key_password set without"),
        ({"kafka_security_protocol": "TLS"}, "kafka_security_protocol"),
        ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "GSSAPI"}, "kafka_sasl_mechanism"),
    ],
)
def test_a_bad_security_setup_fails_at_load_naming_the_key(values, named):
    with pytest.raises(ValidationError) as raised:
        TurnlogSettings(**values)
    assert named in str(raised.value)


def test_the_environment_is_read(monkeypatch):
    monkeypatch.setenv("TURNLOG_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("TURNLOG_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("TURNLOG_KAFKA_SASL_USERNAME", "agent")
    monkeypatch.setenv("TURNLOG_KAFKA_SASL_PASSWORD", PASSWORD)
    config = kafka.client_config(TurnlogSettings())
    assert (config["security.protocol"], config["sasl.mechanism"], config["sasl.password"]) == (
        "SASL_PLAINTEXT", "PLAIN", PASSWORD
    )


# --- error conversion ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind", "retriable"),
    [
        (KafkaError._TRANSPORT, kafka.BrokerUnavailableError, True),
        (KafkaError._ALL_BROKERS_DOWN, kafka.BrokerUnavailableError, True),
        (KafkaError.COORDINATOR_LOAD_IN_PROGRESS, kafka.BrokerUnavailableError, True),
        (KafkaError.NOT_COORDINATOR, kafka.BrokerUnavailableError, True),
        (KafkaError.OFFSET_NOT_AVAILABLE, kafka.BrokerUnavailableError, True),
        (KafkaError._INVALID_ARG, kafka.BrokerConfigurationError, False),
        (KafkaError.SASL_AUTHENTICATION_FAILED, kafka.BrokerConfigurationError, False),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, kafka.BrokerConfigurationError, False),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, kafka.UnknownTopicError, None),
        (KafkaError.TOPIC_ALREADY_EXISTS, kafka.TopicAlreadyExistsError, False),
        (KafkaError.MSG_SIZE_TOO_LARGE, kafka.RecordRefusedError, False),
        (KafkaError.INVALID_CONFIG, kafka.BrokerError, False),
    ],
)
def test_kafka_errors_become_the_most_specific_turnlog_error(code, kind, retriable):
    converted = kafka.to_broker_error(KafkaException(KafkaError(code)), "unit")
    assert type(converted) is kind
    assert isinstance(converted, TurnlogError)
    assert converted.code == code
    if retriable is not None:
        assert converted.retriable is retriable
    assert str(converted).startswith("unit: ")


def test_configuration_errors_are_configuration_errors():
    assert isinstance(kafka.to_broker_error(KafkaError(KafkaError._SSL)), ConfigurationError)


def test_the_boundary_raises_from_the_original():
    original = KafkaException(KafkaError(KafkaError._TIMED_OUT))
    with pytest.raises(kafka.BrokerUnavailableError) as raised, kafka.broker_errors("lookup"):
        raise original
    assert raised.value.__cause__ is original


def test_a_refused_client_setting_is_a_configuration_error():
    with pytest.raises(kafka.BrokerConfigurationError) as raised:
        kafka.consumer(TurnlogSettings(), group_id="unit", **{"no.such.property": "1"})
    assert isinstance(raised.value.__cause__, KafkaException)


def test_a_record_the_producer_refuses_is_converted():
    producer = kafka.producer(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), client_id="unit", **{"message.max.bytes": 1000})
    with pytest.raises(kafka.RecordRefusedError) as raised:
        kafka.produce(producer, "turnlog.events", b"x" * 10_000)
    assert raised.value.code == KafkaError.MSG_SIZE_TOO_LARGE


# --- one retry policy ---------------------------------------------------------------------------


def test_lookups_retry_an_unavailable_broker_a_bounded_number_of_times():
    calls = []

    def lookup(timeout: float) -> int:
        calls.append(timeout)
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    with pytest.raises(kafka.BrokerUnavailableError):
        lookup_retry(lookup, "unit")
    assert len(calls) == LOOKUP_ATTEMPTS
    assert all(0 < timeout <= 5.0 for timeout in calls)


def test_lookups_do_not_retry_other_errors_and_return_a_late_success():
    answers = iter([KafkaError._TRANSPORT, KafkaError.UNKNOWN_TOPIC_OR_PART])

    def lookup(_: float) -> int:
        raise KafkaException(KafkaError(next(answers)))

    with pytest.raises(kafka.UnknownTopicError):
        lookup_retry(lookup, "unit")

    flaky = iter([KafkaError._TIMED_OUT])

    def recovers(_: float) -> int:
        code = next(flaky, None)
        if code is not None:
            raise KafkaException(KafkaError(code))
        return 42

    assert lookup_retry(recovers, "unit") == 42


def test_a_past_deadline_stops_the_retries_at_once():
    import time

    calls = []

    def lookup(_: float) -> int:
        calls.append(1)
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    with pytest.raises(kafka.BrokerUnavailableError):
        lookup_retry(lookup, "unit", deadline=time.monotonic() - 1)
    assert len(calls) == 1


def test_the_public_names_are_all_exported():
    # Submodules show up as attributes once anything imported them (which depends on the tests run before).
    exported = {
        name for name in dir(kafka) if not name.startswith("_") and not isinstance(getattr(kafka, name), ModuleType)
    }
    assert exported == set(kafka.__all__)


def test_an_error_the_broker_flags_retriable_is_retried_whatever_its_class():
    # A restarting broker answers UNKNOWN_TOPIC_OR_PART (flagged retriable) for a while.
    answers = iter([KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, retriable=True)])

    def lookup(_: float) -> int:
        error = next(answers, None)
        if error is not None:
            raise KafkaException(error)
        return 7

    assert lookup_retry(lookup, "unit") == 7
