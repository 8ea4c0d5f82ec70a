"""gpulab.login.tls: which certificate HTTPS serves, decided from what is in secrets/tls/."""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import stat
import subprocess

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpulab.login import tls

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
HOST = "gpu.lab.example"
OPENSSL = shutil.which("openssl")


@pytest.fixture(scope="module")
def ca():
    return tls.make_ca(HOST, NOW)


def server(ca, hostname=HOST, now=NOW):
    return tls.make_server(hostname, now, *ca)


def leaf(ca, *names: str, common_name: str = "leaf") -> x509.Certificate:
    """A server certificate for *names* (DNS names or IP addresses) signed with the CA's
    key: what whoever reads ca.key could make."""
    ca_cert, ca_key = ca
    sans = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    key = ec.generate_private_key(ec.SECP256R1())
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(days=1))
            .not_valid_after(NOW + dt.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))


def unconstrained_ca(label=HOST):
    """A local CA as gpulab made it before name constraints (CA:TRUE, nothing else)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpulab"),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"gpulab local CA ({label})")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(days=400))
            .not_valid_after(NOW + dt.timedelta(days=3000))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def openssl_verify(tmp_path, ca_cert: x509.Certificate, cert: x509.Certificate
                   ) -> subprocess.CompletedProcess:
    """`openssl verify -CAfile ca.crt` at NOW: the check a TLS client makes of the chain."""
    (tmp_path / "ca.crt").write_bytes(pem(ca_cert))
    (tmp_path / "leaf.crt").write_bytes(pem(cert))
    return subprocess.run([OPENSSL, "verify", "-attime", str(int(NOW.timestamp())),
                           "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "leaf.crt")],
                          capture_output=True, text=True, timeout=30)


def sans(cert: x509.Certificate) -> list:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value[:]


@pytest.mark.parametrize("names, name, covered", [
    (["gpu.lab.example"], "gpu.lab.example", True),
    (["gpu.lab.example"], "GPU.Lab.Example.", True),
    (["gpu.lab.example"], "other.lab.example", False),
    (["*.lab.example"], "gpu.lab.example", True),
    (["*.lab.example"], "a.gpu.lab.example", False),
    (["*.lab.example"], "lab.example", False),
    (["10.1.2.3"], "10.1.2.3", True),
    (["10.1.2.3"], "10.1.2.4", False),
])
def test_covers_reads_the_subject_alt_names(ca, names, name, covered):
    assert tls.covers(leaf(ca, *names), name) is covered


def test_decide_makes_what_is_missing_and_keeps_what_serves(ca):
    cert, _ = server(ca)
    assert tls.certificate_plan(HOST, NOW, None, None) == tls.CertificatePlan(True, True, "no local CA yet")
    assert tls.certificate_plan(HOST, NOW, ca[0], None).new_server
    assert tls.certificate_plan(HOST, NOW, ca[0], cert) == tls.CertificatePlan(
        False, False, "valid, and it names gpu.lab.example")
    renamed = tls.certificate_plan("hub.gpu.lab.example", NOW, ca[0], cert)  # within the CA's names
    assert (renamed.new_ca, renamed.new_server) == (False, True)
    later = NOW + dt.timedelta(days=tls.SERVER_DAYS - tls.RENEW_DAYS + 1)
    assert tls.certificate_plan(HOST, later, ca[0], cert).new_server
    other_ca = tls.make_ca(HOST, NOW)
    assert tls.certificate_plan(HOST, NOW, other_ca[0], cert).new_server
    expired = NOW + dt.timedelta(days=tls.CA_DAYS + 1)
    assert tls.certificate_plan(HOST, expired, ca[0], cert).new_ca


# (a) the CA vouches for the lab's name only


def test_the_local_ca_has_critical_name_constraints_for_the_labs_name_only(ca):
    ext = ca[0].extensions.get_extension_for_class(x509.NameConstraints)
    assert ext.critical
    assert ext.value.permitted_subtrees == [x509.DNSName("gpu.lab.example")]
    assert ext.value.excluded_subtrees == [  # the hub's certificate names no IP address
        x509.IPAddress(ipaddress.ip_network("0.0.0.0/0")),
        x509.IPAddress(ipaddress.ip_network("::/0"))]


def test_a_local_ca_for_an_ip_address_permits_that_address_and_no_dns_name():
    ca_cert, _ = tls.make_ca("10.1.2.3", NOW)
    ext = ca_cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert ext.critical
    assert ext.value.permitted_subtrees == [
        x509.IPAddress(ipaddress.ip_network("10.1.2.3/32")),
        x509.DNSName("invalid")]  # RFC 6761: never resolves; without it, every DNS name
    assert ext.value.excluded_subtrees is None


@pytest.mark.parametrize("name, permitted", [
    (x509.DNSName("gpu.lab.example"), True),
    (x509.DNSName("*.gpu.lab.example"), True),
    (x509.DNSName("alice.GPU.lab.example."), True),
    (x509.DNSName("evil.example.com"), False),
    (x509.DNSName("xgpu.lab.example"), False),
    (x509.DNSName("lab.example"), False),
    (x509.DNSName("gpu.lab.example.evil.com"), False),
    (x509.IPAddress(ipaddress.ip_address("10.1.2.3")), False),
    (x509.IPAddress(ipaddress.ip_address("::1")), False),
])
def test_permits_follows_rfc_5280_for_the_labs_constraints(name, permitted):
    assert tls.permits(tls.name_constraints(HOST), name) is permitted


# (b) what a TLS client makes of certificates signed with the CA's key


@pytest.mark.skipif(OPENSSL is None, reason="no openssl command on this machine")
@pytest.mark.parametrize("hostname, names, error", [
    (HOST, None, None),  # the hub's own certificate (gpu.lab.example, *.gpu.lab.example)
    (HOST, ["alice.gpu.lab.example"], None),
    (HOST, ["evil.example.com"], "permitted subtree violation"),
    (HOST, ["gpu.lab.example", "evil.example.com"], "permitted subtree violation"),
    (HOST, ["*.lab.example"], "permitted subtree violation"),
    (HOST, ["10.1.2.3"], "excluded subtree violation"),
    ("10.1.2.3", None, None),
    ("10.1.2.3", ["10.1.2.4"], "permitted subtree violation"),
    ("10.1.2.3", ["evil.example.com"], "permitted subtree violation"),
    ("10.1.2.3", ["::1"], "permitted subtree violation"),
])
def test_openssl_accepts_the_labs_names_and_refuses_any_other(tmp_path, hostname, names,
                                                              error):
    ca = tls.make_ca(hostname, NOW)
    cert = server(ca, hostname)[0] if names is None else leaf(ca, *names)
    out = openssl_verify(tmp_path, ca[0], cert)
    if error is None:
        assert out.returncode == 0, out.stdout + out.stderr
    else:
        assert out.returncode != 0 and error in out.stdout + out.stderr, out


@pytest.mark.skipif(OPENSSL is None, reason="no openssl command on this machine")
def test_openssl_verified_anything_an_unconstrained_ca_signed(tmp_path):
    """The finding: before, a leaf for any web site passed."""
    old = unconstrained_ca()
    out = openssl_verify(tmp_path, old[0], leaf(old, "evil.example.com"))
    assert out.returncode == 0, out.stdout + out.stderr


# (c) a local CA from an earlier gpulab


def old_lab(directory, hostname=HOST):
    """secrets/tls/ as an earlier gpulab left it: an unconstrained CA and its server cert."""
    directory.mkdir()
    old = unconstrained_ca(hostname)
    (directory / tls.CA_CERT).write_bytes(pem(old[0]))
    (directory / tls.CA_KEY).write_bytes(key_pem(old[1]))
    (directory / tls.SERVER_CERT).write_bytes(pem(leaf(old, hostname)))
    (directory / tls.SERVER_KEY).write_bytes(key_pem(ec.generate_private_key(ec.SECP256R1())))
    return old


def test_decide_says_an_unconstrained_ca_must_be_replaced():
    old = unconstrained_ca()
    plan = tls.certificate_plan(HOST, NOW, old[0], leaf(old, HOST))
    assert plan == tls.CertificatePlan(True, True, "the local CA has no name constraints: it can vouch "
                                        "for any web site", replaces_ca=True)


def test_an_unconstrained_ca_is_refused_with_how_to_replace_it(tmp_path):
    directory = tmp_path / "tls"
    old = old_lab(directory)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    with pytest.raises(tls.TlsError) as refused:
        tls.ensure(directory, HOST, now=NOW)
    message = str(refused.value)
    fingerprint = old[0].fingerprint(hashes.SHA256()).hex(":").upper()
    for part in [f"{directory / 'ca.crt'}: the local CA has no name constraints: it can "
                 "vouch for any web site;",
                 f"whoever reads {directory / 'ca.key'} can use it against every member",
                 f"mv {directory} {directory}.replaced", "run `make up` again",
                 "limited to gpu.lab.example and the names under it",
                 "remove the old one, 'CN=gpulab local CA (gpu.lab.example),O=gpulab'",
                 f"(SHA-256 {fingerprint})", f"delete {directory}.replaced"]:
        assert part in message, message
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before  # nothing touched
    # Following the message: the folder moved away, a new, constrained CA.
    directory.rename(f"{directory}.replaced")
    assert "made (no local CA yet)" in tls.ensure(directory, HOST, now=NOW)
    new_ca = x509.load_pem_x509_certificate((directory / tls.CA_CERT).read_bytes())
    assert tls.ca_problem(new_ca, HOST) is None


def test_replace_ca_replaces_an_unconstrained_ca_and_says_which_to_remove(tmp_path):
    directory = tmp_path / "tls"
    old = old_lab(directory)
    out = tls.ensure(directory, HOST, now=NOW, replace_ca=True)
    fingerprint = old[0].fingerprint(hashes.SHA256()).hex(":").upper()
    assert "certificate made (the local CA has no name constraints" in out
    assert f"members remove 'CN=gpulab local CA (gpu.lab.example),O=gpulab' (SHA-256 " \
           f"{fingerprint}, kept as {directory}/ca.crt.replaced-20261130120000)" in out
    assert (directory / "ca.crt.replaced-20261130120000").read_bytes() == pem(old[0])
    new_ca = x509.load_pem_x509_certificate((directory / tls.CA_CERT).read_bytes())
    new_key = serialization.load_pem_private_key((directory / tls.CA_KEY).read_bytes(), None)
    assert new_key.public_key() == new_ca.public_key()  # the old key is gone
    assert new_ca.subject.rfc4514_string() == \
        "CN=gpulab local CA (gpu.lab.example\\, 2026-11-30),O=gpulab"
    assert tls.ca_problem(new_ca, HOST) is None
    served = x509.load_pem_x509_certificate((directory / tls.SERVER_CERT).read_bytes())
    assert served.issuer == new_ca.subject
    assert "kept" in tls.ensure(directory, HOST, now=NOW)  # and then it stays


def test_a_host_name_outside_the_cas_names_is_refused_too(tmp_path):
    tls.ensure(tmp_path, HOST, now=NOW)
    with pytest.raises(tls.TlsError, match=r"the local CA is limited to gpu\.lab\.example, "
                                           r"which does not include other\.lab\.example; a "
                                           r"new CA is needed \(a mistyped GPULAB_HOSTNAME"):
        tls.ensure(tmp_path, "other.lab.example", now=NOW)
    assert "limited to other.lab.example" in tls.ensure(tmp_path, "other.lab.example",
                                                        now=NOW, replace_ca=True)


# (d) the server certificate serves members' servers at USER.gpu.lab.example too


def test_the_server_certificate_names_the_host_and_its_subdomains(ca):
    cert, _ = server(ca)
    assert sans(cert) == [x509.DNSName("gpu.lab.example"), x509.DNSName("*.gpu.lab.example")]
    assert tls.covers(cert, "alice.gpu.lab.example")
    ip_cert, _ = tls.make_server("10.1.2.3", NOW, *tls.make_ca("10.1.2.3", NOW))
    assert sans(ip_cert) == [x509.IPAddress(ipaddress.ip_address("10.1.2.3"))]
    # a commonName like "10.1.2.3" would be checked against the DNS constraint by OpenSSL
    assert ip_cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        "gpulab hub at 10.1.2.3"


def test_a_server_certificate_without_the_wildcard_is_made_again(ca):
    plan = tls.certificate_plan(HOST, NOW, ca[0], leaf(ca, HOST))
    assert plan == tls.CertificatePlan(False, True, "the certificate does not name *.gpu.lab.example")


def test_ensure_makes_a_ca_once_and_keeps_it(tmp_path):
    first = tls.ensure(tmp_path, HOST, now=NOW)
    ca_pem = (tmp_path / tls.CA_CERT).read_bytes()
    assert "made (no local CA yet)" in first and str(tmp_path / tls.CA_CERT) in first
    assert "limited to gpu.lab.example and the names under it" in first
    assert stat.S_IMODE((tmp_path / tls.CA_KEY).stat().st_mode) == 0o600
    second = tls.ensure(tmp_path, HOST, now=NOW)
    assert "kept" in second and (tmp_path / tls.CA_CERT).read_bytes() == ca_pem
    tls.ensure(tmp_path, "hub.gpu.lab.example", now=NOW)  # a name under it: same CA, new cert
    assert (tmp_path / tls.CA_CERT).read_bytes() == ca_pem


def write_pair(tmp_path, cert, key, name="lab"):
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(pem(cert))
    key_path.write_bytes(key_pem(key))
    return cert_path, key_path


def test_the_labs_certificate_is_checked_and_copied(tmp_path, ca):
    cert, key = server(ca)
    cert_path, key_path = write_pair(tmp_path, cert, key)
    out = tmp_path / "tls"
    assert "the lab's certificate" in tls.ensure(out, HOST, cert_path, key_path, now=NOW)
    assert (out / tls.SERVER_CERT).read_bytes() == cert_path.read_bytes()
    assert not (out / tls.CA_CERT).exists()  # no local CA where the lab brings its own


def test_the_labs_certificate_is_used_beside_an_old_unconstrained_ca(tmp_path):
    """The local CA is not used then: nothing to refuse (nor to replace)."""
    cert, key = tls.make_server(HOST, NOW, *unconstrained_ca("the lab's own CA"))
    cert_path, key_path = write_pair(tmp_path, cert, key)
    old_lab(tmp_path / "tls")
    old_ca = (tmp_path / "tls" / tls.CA_CERT).read_bytes()
    assert "the lab's certificate" in tls.ensure(tmp_path / "tls", HOST, cert_path, key_path,
                                                 now=NOW)
    assert (tmp_path / "tls" / tls.CA_CERT).read_bytes() == old_ca


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
    hostname = "other.lab.example" if problem == "other name" else HOST
    expected = {"other key": "is not the key of", "other name": "does not name other.lab",
                "expired": "expired on", "only cert": "set both GPULAB_TLS_CERT",
                "not pem": "cannot read a PEM certificate"}[problem]
    with pytest.raises(tls.TlsError, match=expected):
        tls.ensure(tmp_path / "tls", hostname, cert_path,
                   None if problem == "only cert" else key_path, now=NOW)


def test_a_labs_certificate_without_the_wildcard_is_refused_for_per_server_origins(tmp_path):
    """Members' servers at NAME.HOST need *.HOST in the lab's certificate; without it,
    make up says so and how to do without (GPULAB_SUBDOMAINS=no)."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from gpulab.login.tls import TlsError, ensure

    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu.lab.example")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("gpu.lab.example")]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "lab.crt", tmp_path / "lab.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    with pytest.raises(TlsError, match=r"not \*\.gpu\.lab\.example.*GPULAB_SUBDOMAINS=no"):
        ensure(tmp_path / "tls", "gpu.lab.example", cert_path, key_path, subdomains=True)
    assert "lab's certificate" in ensure(tmp_path / "tls", "gpu.lab.example", cert_path,
                                        key_path, subdomains=False)
