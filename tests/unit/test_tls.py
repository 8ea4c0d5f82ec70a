"""gpulab.tls: which certificate HTTPS serves, decided from what is in secrets/tls/."""

from __future__ import annotations

import datetime as dt
import stat

import pytest
from cryptography.hazmat.primitives import serialization

from gpulab import tls

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def ca():
    return tls.make_ca(NOW, "test")


def server(ca, hostname="gpu.lab.example", now=NOW):
    return tls.make_server(hostname, now, *ca)


@pytest.mark.parametrize("hostname, name, covered", [
    ("gpu.lab.example", "gpu.lab.example", True),
    ("gpu.lab.example", "GPU.Lab.Example.", True),
    ("gpu.lab.example", "other.lab.example", False),
    ("*.lab.example", "gpu.lab.example", True),
    ("*.lab.example", "a.gpu.lab.example", False),
    ("*.lab.example", "lab.example", False),
    ("10.1.2.3", "10.1.2.3", True),
    ("10.1.2.3", "10.1.2.4", False),
])
def test_covers_reads_the_subject_alt_names(ca, hostname, name, covered):
    cert, _ = server(ca, hostname)
    assert tls.covers(cert, name) is covered


def test_decide_makes_what_is_missing_and_keeps_what_serves(ca):
    cert, _ = server(ca)
    assert tls.decide("gpu.lab.example", NOW, None, None) == tls.Plan(True, True, "no local CA yet")
    assert tls.decide("gpu.lab.example", NOW, ca[0], None).new_server
    assert tls.decide("gpu.lab.example", NOW, ca[0], cert) == tls.Plan(
        False, False, "valid, and it names gpu.lab.example")
    renamed = tls.decide("other.lab.example", NOW, ca[0], cert)
    assert (renamed.new_ca, renamed.new_server) == (False, True)
    later = NOW + dt.timedelta(days=tls.SERVER_DAYS - tls.RENEW_DAYS + 1)
    assert tls.decide("gpu.lab.example", later, ca[0], cert).new_server
    other_ca = tls.make_ca(NOW, "other")
    assert tls.decide("gpu.lab.example", NOW, other_ca[0], cert).new_server
    expired = NOW + dt.timedelta(days=tls.CA_DAYS + 1)
    assert tls.decide("gpu.lab.example", expired, ca[0], cert).new_ca


def test_ensure_makes_a_ca_once_and_keeps_it(tmp_path):
    first = tls.ensure(tmp_path, "gpu.lab.example", now=NOW)
    ca_pem = (tmp_path / tls.CA_CERT).read_bytes()
    assert "made (no local CA yet)" in first and str(tmp_path / tls.CA_CERT) in first
    assert stat.S_IMODE((tmp_path / tls.CA_KEY).stat().st_mode) == 0o600
    second = tls.ensure(tmp_path, "gpu.lab.example", now=NOW)
    assert "kept" in second and (tmp_path / tls.CA_CERT).read_bytes() == ca_pem
    tls.ensure(tmp_path, "new.lab.example", now=NOW)  # a new name: same CA, new cert
    assert (tmp_path / tls.CA_CERT).read_bytes() == ca_pem


def write_pair(tmp_path, cert, key, name="lab"):
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_the_labs_certificate_is_checked_and_copied(tmp_path, ca):
    cert, key = server(ca)
    cert_path, key_path = write_pair(tmp_path, cert, key)
    out = tmp_path / "tls"
    assert "the lab's certificate" in tls.ensure(out, "gpu.lab.example", cert_path, key_path,
                                                 now=NOW)
    assert (out / tls.SERVER_CERT).read_bytes() == cert_path.read_bytes()
    assert not (out / tls.CA_CERT).exists()  # no local CA where the lab brings its own


@pytest.mark.parametrize("problem", ["other key", "other name", "expired", "only cert",
                                     "not pem"])
def test_a_labs_certificate_that_cannot_serve_is_refused_with_the_reason(tmp_path, ca,
                                                                         problem):
    cert, key = server(ca)
    if problem == "other key":
        key = server(ca)[1]
    if problem == "expired":
        cert, key = server(ca, now=NOW - dt.timedelta(days=tls.SERVER_DAYS + 1))
    cert_path, key_path = write_pair(tmp_path, cert, key)
    if problem == "not pem":
        cert_path.write_text("hello\n")
    hostname = "other.lab.example" if problem == "other name" else "gpu.lab.example"
    expected = {"other key": "is not the key of", "other name": "does not name other.lab",
                "expired": "expired on", "only cert": "set both GPULAB_TLS_CERT",
                "not pem": "cannot read a PEM certificate"}[problem]
    with pytest.raises(tls.TlsError, match=expected):
        tls.ensure(tmp_path / "tls", hostname, cert_path,
                   None if problem == "only cert" else key_path, now=NOW)
