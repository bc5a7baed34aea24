"""Where a caller's keys come from: flags, the environment, or a credentials file.

A credentials file is the JSON `capstan up --secure` writes for its admin user and the
broker's `auth.init_user_file` reads: `{"access_key": "...", "secret_key": "..."}`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from capstan.common.errors import ConfigError
from capstan.security.signature import Credentials

ACCESS_KEY_ENV = "CAPSTAN_ACCESS_KEY"
SECRET_KEY_ENV = "CAPSTAN_SECRET_KEY"
CA_ENV = "CAPSTAN_CA"
"""A CA certificate (PEM file) to trust: calls go over TLS."""
CREDENTIALS_ENV = "CAPSTAN_CREDENTIALS"
"""A credentials file whose keys sign the calls, when no keys are given otherwise."""


def load_credentials_file(path: Path) -> Credentials:
    """The keys in `path`; ConfigError naming the file and what is wrong (never the key)."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the credentials file {path}: {exc.strerror}") from None
    except ValueError:
        raise ConfigError(f"the credentials file {path} is not JSON") from None
    if not isinstance(data, dict):
        raise ConfigError(f"the credentials file {path} must hold a JSON object")
    access, secret = data.get("access_key"), data.get("secret_key")
    if not isinstance(access, str) or not access or not isinstance(secret, str) or not secret:
        raise ConfigError(f"the credentials file {path} needs access_key and secret_key strings")
    return Credentials(access, secret)


def write_credentials_file(path: Path, credentials: Credentials) -> None:
    """Write `credentials` to a new file only its owner may read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(
        {"access_key": credentials.access_key, "secret_key": credentials.secret_key}, indent=2
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")
        out.flush()
        os.fsync(out.fileno())


def credentials_from(
    access_key: str | None,
    secret_key: str | None,
    environ: Mapping[str, str] | None = None,
    credentials_file: str | None = None,
) -> Credentials | None:
    """The keys that sign a caller's calls, the first of: keys given as flags, a
    credentials file given as a flag, CAPSTAN_ACCESS_KEY / CAPSTAN_SECRET_KEY, the
    credentials file CAPSTAN_CREDENTIALS names. None when none names any. ConfigError when
    only one half of a pair is given, or the file cannot be read as keys."""
    env = os.environ if environ is None else environ
    if access_key or secret_key:
        return _pair(access_key or "", secret_key or "")
    if credentials_file:
        return load_credentials_file(Path(credentials_file))
    access, secret = env.get(ACCESS_KEY_ENV) or "", env.get(SECRET_KEY_ENV) or ""
    if access or secret:
        return _pair(access, secret)
    named = env.get(CREDENTIALS_ENV)
    return load_credentials_file(Path(named)) if named else None


def _pair(access: str, secret: str) -> Credentials:
    if not access or not secret:
        raise ConfigError(
            f"an access key needs its secret key and the other way round "
            f"(--access-key/--secret-key or {ACCESS_KEY_ENV}/{SECRET_KEY_ENV})"
        )
    return Credentials(access, secret)


class ClientAccess(TypedDict):
    """Keyword arguments of the SDK's clients."""

    ca_file: str | None
    credentials: Credentials | None


def client_access(environ: Mapping[str, str] | None = None) -> ClientAccess:
    """The `ca_file=` and `credentials=` of the SDK's clients, from CAPSTAN_CA,
    CAPSTAN_ACCESS_KEY and CAPSTAN_SECRET_KEY, or CAPSTAN_CREDENTIALS (none set:
    plaintext, unsigned): how a job
    such as the operator's scheduled Spark jobs is told to reach a secured cluster."""
    env = os.environ if environ is None else environ
    return ClientAccess(
        ca_file=env.get(CA_ENV) or None, credentials=credentials_from(None, None, env)
    )
