"""What `capstan up --secure` makes in its data dir, once, and reuses on the next run:

- `tls/ca.crt` (and `ca.key`): a local CA; every child serves TLS with `tls/node.crt`, a
  certificate for 127.0.0.1 and localhost that it signed;
- `cluster-secret`: the secret the children sign their calls to each other with;
- `admin-credentials.json`: `{"access_key": "admin", "secret_key": ...}`, a super user
  every broker creates at start.

Secrets and keys are readable by their owner alone.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capstan.security.credentials import load_credentials_file, write_credentials_file
from capstan.security.local_ca import create_ca, open_ca
from capstan.security.signature import Credentials

ADMIN_USER = "admin"
SECRET_BYTES = 24
HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class SecureFiles:
    ca: Path
    cert: Path
    key: Path
    cluster_secret: Path
    admin_credentials: Path

    def tls_settings(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "cert_file": str(self.cert.resolve()),
            "key_file": str(self.key.resolve()),
            "ca_file": str(self.ca.resolve()),
            "metrics": True,
        }

    def broker_auth_settings(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "cluster_secret_file": str(self.cluster_secret.resolve()),
            "init_user_file": str(self.admin_credentials.resolve()),
        }

    def controller_auth_settings(self) -> dict[str, Any]:
        return {"enabled": True, "cluster_secret_file": str(self.cluster_secret.resolve())}

    def admin(self) -> Credentials:
        return load_credentials_file(self.admin_credentials)


def prepare(data_dir: Path) -> SecureFiles:
    """The secure files of `data_dir`, made where missing."""
    tls = data_dir / "tls"
    files = SecureFiles(
        ca=tls / "ca.crt",
        cert=tls / "node.crt",
        key=tls / "node.key",
        cluster_secret=data_dir / "cluster-secret",
        admin_credentials=data_dir / "admin-credentials.json",
    )
    ca = open_ca(tls) if files.ca.exists() else create_ca(tls)
    if not files.cert.exists() or not files.key.exists():
        ca.issue(tls, "node", HOSTS)
    if not files.cluster_secret.exists():
        _write_secret(files.cluster_secret, secrets.token_urlsafe(SECRET_BYTES))
    if not files.admin_credentials.exists():
        admin = Credentials(ADMIN_USER, secrets.token_urlsafe(SECRET_BYTES))
        write_credentials_file(files.admin_credentials, admin)
    return files


def _write_secret(path: Path, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret + "\n")
