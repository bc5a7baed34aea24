"""Where a caller's keys come from: flags, a credentials file, the environment, in that
order, and what is said when they are incomplete."""

from __future__ import annotations

import json

import pytest

from capstan.common.errors import ConfigError
from capstan.security.credentials import client_access, credentials_from
from capstan.security.signature import Credentials


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"access_key": "filed", "secret_key": "filed-secret"}))
    return str(path)


def test_flags_come_first_then_a_file_flag_then_the_environment_then_its_file(keys_file):
    env = {"CAPSTAN_ACCESS_KEY": "env", "CAPSTAN_SECRET_KEY": "env-secret"}
    assert credentials_from("flag", "flag-secret", env, keys_file) == Credentials(
        "flag", "flag-secret"
    )
    assert credentials_from(None, None, env, keys_file) == Credentials("filed", "filed-secret")
    assert credentials_from(None, None, env) == Credentials("env", "env-secret")
    named = {"CAPSTAN_CREDENTIALS": keys_file}
    assert credentials_from(None, None, named) == Credentials("filed", "filed-secret")
    assert credentials_from(None, None, {**named, **env}) == Credentials("env", "env-secret")
    assert credentials_from(None, None, {}) is None


def test_the_sdk_reads_a_credentials_file_from_the_environment(keys_file):
    access = client_access({"CAPSTAN_CREDENTIALS": keys_file, "CAPSTAN_CA": "/ca.crt"})
    assert access == {"ca_file": "/ca.crt", "credentials": Credentials("filed", "filed-secret")}


def test_half_a_pair_or_a_bad_file_is_an_error_naming_what_is_wrong(tmp_path):
    with pytest.raises(ConfigError, match="needs its secret key"):
        credentials_from("only-access", None, {})
    with pytest.raises(ConfigError, match="needs its secret key"):
        credentials_from(None, None, {"CAPSTAN_SECRET_KEY": "s"})
    missing = tmp_path / "absent.json"
    with pytest.raises(ConfigError, match=f"cannot read the credentials file {missing}"):
        credentials_from(None, None, {"CAPSTAN_CREDENTIALS": str(missing)})
    torn = tmp_path / "torn.json"
    torn.write_text('{"access_key": "a", "secret_')
    with pytest.raises(ConfigError, match="is not JSON"):
        credentials_from(None, None, {}, str(torn))
