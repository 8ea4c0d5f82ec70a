"""Certificates for serving the hub over HTTPS (`make up GPULAB_HOSTNAME=...`).

configurable-http-proxy terminates TLS with the files this module puts in one folder
(`secrets/tls/` on the host): ``server.crt`` (the chain, leaf first) and ``server.key``.
They come, in order, from:

1. the lab's own certificate and key (``--cert``/``--key``, from GPULAB_TLS_CERT and
   GPULAB_TLS_KEY): checked (the key matches, the name is covered, not expired) and
   copied;
2. otherwise a local CA, generated once and kept (``ca.crt``: members import it into
   their browser, once), which signs a server certificate for the host name; the server
   certificate is made again when the name changes or it nears its end.

`decide` is pure (what to do with what is there); `ensure` does the file work. Run as
``gpulab tls --hostname NAME --dir DIR`` (the Makefile does, in the hub image).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY = "ca.crt", "ca.key"
SERVER_CERT, SERVER_KEY = "server.crt", "server.key"
SUPPLIED = "supplied-by-the-lab"  # marker: the server files are the lab's, never replaced
CA_DAYS, SERVER_DAYS, RENEW_DAYS = 3650, 397, 30


class TlsError(ValueError):
    """A certificate or key that cannot be used, with what to do about it."""


@dataclass(frozen=True)
class Plan:
    new_ca: bool
    new_server: bool
    reason: str


def covers(cert: x509.Certificate, hostname: str) -> bool:
    """True when the certificate's subjectAltName names *hostname* (or its IP address)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        return ipaddress.ip_address(hostname) in san.get_values_for_type(x509.IPAddress)
    except ValueError:
        pass
    name = hostname.lower().rstrip(".")
    for pattern in san.get_values_for_type(x509.DNSName):
        pattern = pattern.lower().rstrip(".")
        if pattern == name:
            return True
        if pattern.startswith("*.") and name.count(".") >= 2 and \
                name.split(".", 1)[1] == pattern[2:]:
            return True
    return False


def decide(hostname: str, now: dt.datetime, ca: x509.Certificate | None,
           server: x509.Certificate | None) -> Plan:
    """What a local CA setup needs: a CA when there is none (or it expired), and a
    server certificate when there is none, it was not signed by this CA, it does not
    name *hostname*, or it ends within RENEW_DAYS."""
    if ca is None or ca.not_valid_after_utc <= now:
        return Plan(True, True, "no local CA yet" if ca is None else "the local CA expired")
    if server is None:
        return Plan(False, True, f"no certificate for {hostname} yet")
    if server.issuer != ca.subject:
        return Plan(False, True, "the certificate was not signed by the local CA")
    if not covers(server, hostname):
        return Plan(False, True, f"the certificate does not name {hostname}")
    if server.not_valid_after_utc - now < dt.timedelta(days=RENEW_DAYS):
        return Plan(False, True, "the certificate ends within "
                                 f"{RENEW_DAYS} days")
    return Plan(False, False, f"valid, and it names {hostname}")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpulab"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(now: dt.datetime, label: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    name = _name(f"gpulab local CA ({label})")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def make_server(hostname: str, now: dt.datetime, ca: x509.Certificate,
                ca_key: ec.EllipticCurvePrivateKey
                ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    try:
        alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(hostname))
    except ValueError:
        alt = x509.DNSName(hostname)
    cert = (x509.CertificateBuilder().subject_name(_name(hostname)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=SERVER_DAYS))
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    tmp.replace(path)


def _load_cert(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise TlsError(f"{path}: not a PEM certificate ({e})") from None


def check_supplied(cert_path: Path, key_path: Path, hostname: str, now: dt.datetime
                   ) -> list[x509.Certificate]:
    """The lab's chain, refused with a clear reason when it cannot serve *hostname*."""
    try:
        chain = x509.load_pem_x509_certificates(cert_path.read_bytes())
    except (OSError, ValueError) as e:
        raise TlsError(f"GPULAB_TLS_CERT={cert_path}: cannot read a PEM certificate: {e}") \
            from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise TlsError(f"GPULAB_TLS_KEY={key_path}: cannot read an unencrypted PEM private "
                       f"key: {e}") from None
    leaf = chain[0]
    if leaf.public_key().public_numbers() != key.public_key().public_numbers():
        raise TlsError(f"GPULAB_TLS_KEY={key_path} is not the key of the first certificate "
                       f"in GPULAB_TLS_CERT={cert_path}")
    if not covers(leaf, hostname):
        raise TlsError(f"GPULAB_TLS_CERT={cert_path} does not name {hostname} "
                       f"(subjectAltName); set GPULAB_HOSTNAME to a name it covers")
    if leaf.not_valid_after_utc <= now:
        raise TlsError(f"GPULAB_TLS_CERT={cert_path} expired on "
                       f"{leaf.not_valid_after_utc:%Y-%m-%d}")
    return chain


def ensure(directory: Path, hostname: str, cert: Path | None = None, key: Path | None = None,
           now: dt.datetime | None = None) -> str:
    """Put usable server.crt/server.key in *directory*; a line saying what was done."""
    now = now or dt.datetime.now(dt.UTC)
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / SUPPLIED
    if cert or key:
        if not (cert and key):
            raise TlsError("set both GPULAB_TLS_CERT and GPULAB_TLS_KEY, or neither")
        check_supplied(cert, key, hostname, now)
        # The proxy runs as nobody: the key is readable in the folder it mounts, which
        # sits in the host's secrets/ (0700, root's).
        shutil.copyfile(cert, directory / SERVER_CERT)
        _write(directory / SERVER_KEY, key.read_bytes(), 0o644)
        os.chmod(directory / SERVER_CERT, 0o644)
        marker.write_text(f"{cert}\n")
        return f"HTTPS for {hostname} with the lab's certificate {cert}"
    if marker.exists():
        marker.unlink()  # the lab's files go; a local CA's take their place
        (directory / SERVER_CERT).unlink(missing_ok=True)
    ca = _load_cert(directory / CA_CERT)
    server = _load_cert(directory / SERVER_CERT)
    plan = decide(hostname, now, ca, server)
    if plan.new_ca:
        ca, ca_key = make_ca(now, hostname)
        _write(directory / CA_KEY, _key_pem(ca_key), 0o600)
        _write(directory / CA_CERT, _pem(ca), 0o644)
    else:
        ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
    if plan.new_server:
        server, server_key = make_server(hostname, now, ca, ca_key)
        _write(directory / SERVER_KEY, _key_pem(server_key), 0o644)
        _write(directory / SERVER_CERT, _pem(server), 0o644)
    fingerprint = ca.fingerprint(hashes.SHA256()).hex(":").upper()
    done = "made" if plan.new_server else "kept"
    return (f"HTTPS for {hostname}: certificate {done} ({plan.reason}), signed by the local "
            f"CA {directory / CA_CERT} (SHA-256 {fingerprint}); members import that file "
            f"into their browser once")
