"""A small certificate authority for `capstan up --secure`, the tests and the operator: an
EC P-256 CA, and certificates it signs for servers (with their DNS names and addresses)
and for the cluster's own processes (whose common name says who they are).

Keys are written readable by their owner alone; certificates are PEM files anyone may read.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
CERT_DAYS = 365
BACKDATE = datetime.timedelta(minutes=5)
"""Certificates start a little in the past, so a peer whose clock is slightly behind
accepts them at once."""


@dataclass(frozen=True)
class PemPair:
    """A certificate and its private key, PEM-encoded (as a Kubernetes Secret holds them)."""

    certificate: bytes
    key: bytes


@dataclass(frozen=True)
class CertificateFacts:
    """What a renewal decision needs to know of a certificate."""

    subject: str
    issuer: str
    not_before: datetime.datetime
    not_after: datetime.datetime
    hosts: frozenset[str]
    is_ca: bool


def read_certificate(pem: bytes) -> CertificateFacts:
    """The facts of the first certificate in `pem`; ValueError if it holds none."""
    cert = x509.load_pem_x509_certificate(pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        hosts = frozenset(
            [*names.get_values_for_type(x509.DNSName)]
            + [str(a) for a in names.get_values_for_type(x509.IPAddress)]
        )
    except x509.ExtensionNotFound:
        hosts = frozenset()
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    return CertificateFacts(
        subject=cert.subject.rfc4514_string(),
        issuer=cert.issuer.rfc4514_string(),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        hosts=hosts,
        is_ca=is_ca,
    )


def signed_by(certificate: bytes, ca_certificate: bytes) -> bool:
    """Whether `ca_certificate`'s key signed `certificate`."""
    cert = x509.load_pem_x509_certificate(certificate)
    ca = x509.load_pem_x509_certificate(ca_certificate)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def new_ca_pem(
    name: str = "Capstan local CA", days: int = CA_DAYS, now: datetime.datetime | None = None
) -> PemPair:
    """A new self-signed EC P-256 CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    start = (now or datetime.datetime.now(datetime.UTC)) - BACKDATE
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return PemPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_pem(
    ca: PemPair,
    name: str,
    hosts: Sequence[str] = (),
    days: int = CERT_DAYS,
    now: datetime.datetime | None = None,
) -> PemPair:
    """A certificate for `name` (its common name), valid for `hosts` (DNS names or IP
    addresses), usable by servers and clients alike, signed by `ca`."""
    ca_key = _load_key_pem(ca.key)
    ca_cert = x509.load_pem_x509_certificate(ca.certificate)
    key = ec.generate_private_key(ec.SECP256R1())
    start = (now or datetime.datetime.now(datetime.UTC)) - BACKDATE
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return PemPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


@dataclass(frozen=True)
class KeyPair:
    certificate: Path
    key: Path


@dataclass(frozen=True)
class LocalCa:
    """A CA kept in files (ca.crt, ca.key)."""

    certificate: Path
    key: Path

    def issue(
        self,
        directory: Path,
        name: str,
        hosts: Sequence[str] = (),
        days: int = CERT_DAYS,
        now: datetime.datetime | None = None,
    ) -> KeyPair:
        """`issue_pem`, written to `directory` as <name>.crt and <name>.key."""
        ca = PemPair(self.certificate.read_bytes(), self.key.read_bytes())
        issued = issue_pem(ca, name, hosts, days, now)
        pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
        _write(pair.key, issued.key, 0o600)
        _write(pair.certificate, issued.certificate, 0o644)
        return pair


def create_ca(directory: Path, name: str = "Capstan local CA", days: int = CA_DAYS) -> LocalCa:
    """A new CA in `directory` (ca.crt, ca.key)."""
    made = new_ca_pem(name, days)
    ca = LocalCa(directory / "ca.crt", directory / "ca.key")
    _write(ca.key, made.key, 0o600)
    _write(ca.certificate, made.certificate, 0o644)
    return ca


def open_ca(directory: Path) -> LocalCa:
    return LocalCa(directory / "ca.crt", directory / "ca.key")


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _load_key_pem(pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("not an EC private key")
    return key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to a temporary file of `mode`, then rename it over `path`: a reader
    watching `path` sees the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    tmp.chmod(mode)
    tmp.replace(path)
