"""TLS settings for test processes on 127.0.0.1, from a CA made for the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capstan.security.local_ca import LocalCa, create_ca

HOSTS = ("127.0.0.1", "localhost")


def tls_settings(root: Path, name: str = "node") -> tuple[dict[str, Any], LocalCa]:
    """The `tls:` section of a broker or controller config, and the CA that signed it."""
    ca = create_ca(root / "ca")
    pair = ca.issue(root / "certs", name, HOSTS)
    settings = {
        "enabled": True,
        "cert_file": str(pair.certificate),
        "key_file": str(pair.key),
        "ca_file": str(ca.certificate),
    }
    return settings, ca
