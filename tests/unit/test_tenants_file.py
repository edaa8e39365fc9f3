"""The tenants file: what it accepts, and every mistake refused with the field it names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_service.settings import Settings
from sandbox_service.tenancy import DEFAULT_TENANT, Tenant
from sandbox_service.tenants_file import TenantsFileError, parse

TWO = """
[[tenant]]
name = "run-a"
key = "key-a"
weight = 3
max_in_flight = 100
max_sessions = 7

[[tenant]]
name = "run_b"
key = "key-b"
"""


def test_two_tenants_with_their_quotas_and_defaults() -> None:
    a, b = parse(TWO)
    assert (a.key, a.tenant) == (b"key-a", Tenant("run-a", 3.0, 100, 7))
    assert (b.key, b.tenant) == (b"key-b", Tenant("run_b", 1.0, None, None))
    assert "key-a" not in repr(a)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[[tenant]]\nname = 'a'\n", "`key`"),
        ("[[tenant]]\nname = 'a'\nkey = ''\n", "`key`"),
        ("[[tenant]]\nname = 'a/b'\nkey = 'k'\n", "`name`"),
        ("[[tenant]]\nname = 'a'\nkey = 'k'\nweight = 0\n", "`weight`"),
        ("[[tenant]]\nname = 'a'\nkey = 'k'\nweight = nan\n", "`weight`"),
        ("[[tenant]]\nname = 'a'\nkey = 'k'\nweight = true\n", "`weight`"),
        ("[[tenant]]\nname = 'a'\nkey = 'k'\nmax_in_flight = 0\n", "`max_in_flight`"),
        ("[[tenant]]\nname = 'a'\nkey = 'k'\nmax_sessions = 1.5\n", "`max_sessions`"),
        ("[[tenant]]\nname = 'a'\nkey = 'k'\nweigth = 2\n", "weigth"),
        ("[[tenant]]\nname = 'a'\nkey = 'k'\n[[tenant]]\nname = 'b'\nkey = 'k'\n", "`key`"),
        ("[[tenant]]\nname = 'a'\nkey = 'k'\n[[tenant]]\nname = 'a'\nkey = 'j'\n", "`name`"),
        ("api_key = 'k'\n", "top-level"),
        ("", "no [[tenant]]"),
        ("[[tenant]\n", "TOML"),
    ],
)
def test_mistakes_are_refused_naming_the_field(text: str, named: str) -> None:
    with pytest.raises(TenantsFileError, match=named.replace("[", r"\[")):
        parse(text)


def test_a_duplicate_key_is_refused_without_showing_it() -> None:
    text = "[[tenant]]\nname = 'a'\nkey = 'secret'\n[[tenant]]\nname = 'b'\nkey = 'secret'\n"
    with pytest.raises(TenantsFileError) as raised:
        parse(text)
    assert "secret" not in str(raised.value)


def test_settings_read_the_file_and_refuse_a_bad_one(tmp_path: Path) -> None:
    good = tmp_path / "tenants.toml"
    good.write_text(TWO)
    settings = Settings(tenants_file=good)
    assert [t.name for t in settings.tenants()] == ["run-a", "run_b"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tenant]]\nname = 'a'\n")
    with pytest.raises(TenantsFileError, match="`key`"):
        Settings(tenants_file=bad).credentials()
    with pytest.raises(TenantsFileError, match="cannot be read"):
        Settings(tenants_file=tmp_path / "missing.toml").credentials()
    both = Settings(tenants_file=good, api_key="k")
    assert [t.name for t in both.tenants()] == ["default", "run-a", "run_b"]
    with pytest.raises(TenantsFileError, match="'default'"):
        Settings(tenants_file=good, api_key="key-a").credentials()  # the same key twice


def test_the_api_refuses_to_start_on_a_bad_file_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tenant]]\nname = 'a'\nkey = 'k'\nweight = -1\n")
    env = {**os.environ, "RL_SANDBOX_TENANTS_FILE": str(bad), "RL_SANDBOX_REDIS_URL": "redis://x"}
    command = [sys.executable, "-m", "sandbox_service.cli", "api", "--port", "0"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "tenant 0 (a): `weight` must be a finite number > 0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_operator_key_is_refused_when_it_is_a_tenants_key(tmp_path: Path) -> None:
    good = tmp_path / "tenants.toml"
    good.write_text(TWO)
    assert len(Settings(tenants_file=good, operator_key="ops").credentials()) == 2
    with pytest.raises(TenantsFileError, match="operator_key") as raised:
        Settings(tenants_file=good, operator_key="key-a").credentials()
    assert "key-a" not in str(raised.value)
    with pytest.raises(TenantsFileError, match="operator_key"):
        Settings(api_key="k", operator_key="k").credentials()


def test_a_single_key_is_the_default_tenant_and_no_key_an_open_server() -> None:
    (credential,) = Settings(api_key="k").credentials()
    assert (credential.key, credential.tenant) == (b"k", DEFAULT_TENANT)
    assert Settings().credentials() == ()
    assert Settings().tenants() == (DEFAULT_TENANT,)


def test_a_tenant_named_by_a_record_gets_its_configured_quotas_back() -> None:
    from sandbox_service.tenancy import Tenant, configured

    alice = Tenant("alice", weight=2.0, max_in_flight=3, max_sessions=1)
    assert configured({"alice": alice}, "alice") is alice  # not a name-only Tenant: no bypass
    assert configured({"alice": alice}, "gone") == Tenant("gone")
