"""TLS credentials from PEM files: a server's, re-read when its files change, and a
client's, trusting one CA.

A server's certificate and key are looked at on every new connection (gRPC asks the
fetcher at each handshake); when either file's size or modification time changed, both
are read again and the new pair serves from then on. Connections already open keep the
pair they began with, so a rotation fails no call. While the key and the certificate do not
match (one replaced, the other not yet) the previous pair goes on and the files are looked
at again at the next handshake; a pair that cannot be read is logged and left.
"""

from __future__ import annotations

import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from capstan.common.errors import ConfigError
from capstan.common.security_settings import TlsSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Stamp:
    inode: int
    size: int
    mtime_ns: int


def _stamp(path: Path) -> _Stamp:
    """The file's identity, following links: a Kubernetes Secret volume replaces its
    files by swapping a link to a new directory."""
    st = path.stat()
    return _Stamp(st.st_ino, st.st_size, st.st_mtime_ns)


def read_pem(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"the {what} {path} is not PEM")
    return data


class ReloadingServerCredentials:
    """Server credentials from `cert_file` and `key_file`, re-read when they change."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self._cert_file = cert_file
        self._key_file = key_file
        self._lock = threading.Lock()
        self._stamps = (_stamp(cert_file), _stamp(key_file))
        self._pair = (read_pem(key_file, "TLS key"), read_pem(cert_file, "TLS certificate"))
        self.reloads = 0
        """How many times a changed pair was taken up."""

    def credentials(self) -> grpc.ServerCredentials:
        initial = grpc.ssl_server_certificate_configuration([self._pair])
        return grpc.dynamic_ssl_server_credentials(initial, self._fetch)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC at each handshake: a new configuration, or None to keep it."""
        with self._lock:
            try:
                stamps = (_stamp(self._cert_file), _stamp(self._key_file))
            except OSError:
                return None  # being replaced; the next handshake looks again
            if stamps == self._stamps:
                return None
            try:
                pair = (
                    read_pem(self._key_file, "TLS key"),
                    read_pem(self._cert_file, "TLS certificate"),
                )
                if not key_matches(pair[0], pair[1]):
                    return None  # one file replaced, the other not yet: look again next time
            except ConfigError as exc:
                log.error("keeping the previous TLS certificate: %s", exc)
                self._stamps = stamps
                return None
            self._stamps = stamps
            self._pair = pair
            self.reloads += 1
            log.info("serving a new TLS certificate from %s", self._cert_file)
            return grpc.ssl_server_certificate_configuration([pair])


class ReloadingSslContext:
    """An `ssl.SSLContext` serving `cert_file` and `key_file`, made again when either
    file changes (the HTTP endpoints' counterpart of ReloadingServerCredentials): each new
    connection takes the context current at its accept; a pair that cannot be loaded is
    logged and the previous one goes on."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self._cert_file = cert_file
        self._key_file = key_file
        self._lock = threading.Lock()
        self._stamps = (_stamp(cert_file), _stamp(key_file))
        self._context = self._load()
        self.reloads = 0

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self._cert_file, self._key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot serve HTTPS with {self._cert_file} and {self._key_file}: {exc}"
            ) from None
        return context

    def current(self) -> ssl.SSLContext:
        with self._lock:
            try:
                stamps = (_stamp(self._cert_file), _stamp(self._key_file))
            except OSError:
                return self._context  # being replaced; the next connection looks again
            if stamps != self._stamps:
                try:
                    self._context = self._load()
                except ConfigError as exc:
                    log.error("keeping the previous HTTPS certificate: %s", exc)
                else:
                    self.reloads += 1
                    log.info("serving a new HTTPS certificate from %s", self._cert_file)
                self._stamps = stamps
            return self._context


def key_matches(key_pem: bytes, cert_pem: bytes) -> bool:
    """Whether the private key is the certificate's (its public key is the one certified)."""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise ConfigError(f"the TLS key or certificate does not parse: {exc}") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    return bool(
        key.public_key().public_bytes(encoding, public)
        == cert.public_key().public_bytes(encoding, public)
    )


def channel_credentials(ca_file: Path) -> grpc.ChannelCredentials:
    """Client credentials that trust the CA in `ca_file` (and nothing else)."""
    return grpc.ssl_channel_credentials(root_certificates=read_pem(ca_file, "CA certificate"))


def https_context(settings: TlsSettings) -> ReloadingSslContext | None:
    """The HTTPS context of the HTTP endpoints when `settings` ask for it (`metrics`)."""
    if not (settings.enabled and settings.metrics):
        return None
    return ReloadingSslContext(
        Path(settings.cert_file).expanduser(), Path(settings.key_file).expanduser()
    )


def server_tls(settings: TlsSettings) -> ReloadingServerCredentials | None:
    """The server credentials `settings` ask for; None for plaintext."""
    if not settings.enabled:
        return None
    return ReloadingServerCredentials(
        Path(settings.cert_file).expanduser(), Path(settings.key_file).expanduser()
    )
