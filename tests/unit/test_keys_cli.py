"""`turnlog keys init|rotate|public` as an operator runs them, and the readers' refusal to start
with a keyring that does not hold the agents' KEK."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest
from pydantic import SecretStr

from turnlog.crypto.config import event_opener, recorder_kek
from turnlog.crypto.envelope import EpochSealer
from turnlog.crypto.keys import (
    FileKekProvider,
    KeyMaterialError,
    create_keyring_file,
    generate_private_key,
    private_key_text,
    public_key_text,
)
from turnlog.deploy.processes import turnlog_command
from turnlog.settings import TurnlogSettings

from tests.support import EventFactory


def keys(*args: str, keyring) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNLOG_")}
    return subprocess.run(turnlog_command("keys", *args), env={**env, "TURNLOG_KEYRING_FILE": str(keyring)},
                          capture_output=True, text=True, timeout=120)


def public_line(result: subprocess.CompletedProcess[str]) -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith("TURNLOG_KEK_PUBLIC_KEY="))


def test_init_rotate_and_public_print_what_agents_are_given_and_never_a_private_key(tmp_path):
    keyring = tmp_path / "keys" / "keyring"
    created = keys("init", keyring=keyring)
    assert created.returncode == 0, created.stderr
    assert stat.S_IMODE(keyring.stat().st_mode) == 0o600
    first = FileKekProvider(keyring).ring().current
    assert public_line(created) == f"TURNLOG_KEK_PUBLIC_KEY={public_key_text(first.key)}"
    assert keys("init", keyring=keyring).returncode == 1  # never overwrites a keyring
    rotated = keys("rotate", keyring=keyring)
    ring = FileKekProvider(keyring).ring()
    assert rotated.returncode == 0 and ring.ids[1] == first.id and ring.current.id != first.id
    shown = keys("public", keyring=keyring)
    assert public_line(shown) == f"TURNLOG_KEK_PUBLIC_KEY={public_key_text(ring.current.key)}"
    for result in (created, rotated, shown):
        assert "x25519-private:" not in result.stdout + result.stderr


def test_a_reader_refuses_to_start_when_its_keyring_lacks_the_agents_kek(tmp_path):
    create_keyring_file(tmp_path / "ours")
    theirs = create_keyring_file(tmp_path / "theirs")
    settings = TurnlogSettings(keyring_file=str(tmp_path / "ours"), kek_public_key=public_key_text(theirs.key))
    with pytest.raises(KeyMaterialError, match=f"KEK {theirs.id}, which the keyring"):
        event_opener(settings)
    environment = {**settings.as_environment(), "PATH": os.environ["PATH"],
                   "TURNLOG_DATABASE_URL": f"sqlite:///{tmp_path}/never-opened.db"}
    for command in ("sink", "api"):
        refused = subprocess.run(turnlog_command(command), env=environment, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and theirs.id in refused.stderr, refused.stderr
    assert not (tmp_path / "never-opened.db").exists()  # refused before the store was touched


def test_required_encryption_without_keys_refuses_and_auto_writes_plain():
    with pytest.raises(KeyMaterialError, match="TURNLOG_KEK_PUBLIC_KEY"):
        recorder_kek(TurnlogSettings(encryption="required"))
    with pytest.raises(KeyMaterialError, match="TURNLOG_KEYRING_FILE"):
        event_opener(TurnlogSettings(encryption="required"))
    assert recorder_kek(TurnlogSettings()) is None and event_opener(TurnlogSettings()) is None


def test_off_never_seals_even_with_a_kek(tmp_path):
    public = create_keyring_file(tmp_path / "k")
    assert recorder_kek(TurnlogSettings(encryption="off", kek_public_key=public_key_text(public.key))) is None


def test_a_keyring_given_as_a_secret_environment_variable_opens_what_its_kek_sealed(tmp_path):
    public = create_keyring_file(tmp_path / "k")
    text = (tmp_path / "k").read_text()
    settings = TurnlogSettings(keyring=SecretStr(text))
    assert "x25519-private" not in repr(settings) and recorder_kek(settings).id == public.id
    sealed = EpochSealer(public, "s-env", 0).seal(EventFactory("s-env").partial(1, 0, "from the environment"))
    assert event_opener(settings).open(sealed).text == "from the environment"
    assert settings.as_environment()["TURNLOG_KEYRING"] == text  # a child process gets the secret itself
    with pytest.raises(KeyMaterialError, match="TURNLOG_KEYRING: keyring line 1"):
        event_opener(TurnlogSettings(keyring=SecretStr("x25519-private:short")))
    with pytest.raises(ValueError, match="keyring and keyring_file both set"):
        TurnlogSettings(keyring=SecretStr(private_key_text(generate_private_key())), keyring_file=str(tmp_path / "k"))
