"""https image URLs (`--image-urls on`) against local TLS origins on 127.0.0.1.

Two certificate authorities made here: the fetching server trusts one of them through
SSL_CERT_FILE (the bundle OpenSSL reads by default, which is how an operator adds a
private CA) and not the other. Asserted: an image behind the trusted CA is fetched; one
behind the other CA is a clear 400 (no traceback, no path); redirects that cross from
http to https and back are followed, and every hop's address is checked again.
"""

from __future__ import annotations

import http.server
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import RunningServer, start_server, stop_server, write_test_projector
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edge_testkit.images import Origin, chat

PARAM = "messages[0].content[0].image_url.url"


@dataclass
class Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def make_authority(name: str) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256()))
    return Authority(cert, key)


def issue_server_cert(ca: Authority, directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost signed by `ca`: (chain file, key file)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder().subject_name(_name("localhost")).issuer_name(ca.cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
                       critical=False)
        .sign(ca.key, hashes.SHA256()))
    chain, key_file = directory / "server.pem", directory / "server-key.pem"
    chain.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca.pem())
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return chain, key_file


def serve(tls: ssl.SSLContext | None) -> tuple[http.server.ThreadingHTTPServer, int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


@dataclass
class Origins:
    trusted: str  # https, certificate from the CA the fetching server trusts
    stranger: str  # https, certificate from a CA it does not
    plain: str  # http
    ca_file: Path


@pytest.fixture(scope="module")
def origins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Origins]:
    tmp = tmp_path_factory.mktemp("tls-origins")
    servers = []
    urls = []
    for name in ("trusted", "stranger"):
        directory = tmp / name
        directory.mkdir()
        ca = make_authority(f"edge-server test CA ({name})")
        (directory / "ca.pem").write_bytes(ca.pem())
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(*issue_server_cert(ca, directory))
        server, port = serve(tls)
        servers.append(server)
        urls.append(f"https://127.0.0.1:{port}")
    plain, port = serve(None)
    servers.append(plain)
    yield Origins(urls[0], urls[1], f"http://127.0.0.1:{port}", tmp / "trusted" / "ca.pem")
    for server in servers:
        server.shutdown()


@pytest.fixture(scope="module")
def fetching(tmp_path_factory: pytest.TempPathFactory, origins: Origins
             ) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("tls-fetching")
    projector = write_test_projector(tmp / "mmproj.gguf")
    server = start_server(tmp, "--mmproj", str(projector), "--image-urls", "on",
                          "--image-url-networks", "127.0.0.1/32", "--image-url-timeout", "30",
                          "--parallel", "2", name="tls-fetching",
                          env={"SSL_CERT_FILE": str(origins.ca_file)})
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def test_an_image_behind_a_trusted_private_ca_is_fetched(fetching: RunningServer,
                                                         origins: Origins) -> None:
    r = chat(fetching, f"{origins.trusted}/picture.png")
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 16  # the image's tokens among them


def test_an_untrusted_certificate_is_a_clear_400(fetching: RunningServer,
                                                 origins: Origins) -> None:
    r = chat(fetching, f"{origins.stranger}/picture.png")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "image_fetch_failed" and error["param"] == PARAM
    assert "certificate" in error["message"]
    assert "Traceback" not in r.text and str(origins.ca_file.parent.parent) not in r.text
    # The server is fine afterwards.
    assert chat(fetching, f"{origins.trusted}/picture.png").status_code == 200


def test_redirects_between_http_and_https_are_checked_at_every_hop(
        fetching: RunningServer, origins: Origins) -> None:
    def via_https(target: str) -> str:  # http -> https -> target
        return f"{origins.plain}/to?url={origins.trusted}/to?url={target}"

    back_to_http = chat(fetching, via_https(f"{origins.plain}/picture.png"))
    assert back_to_http.status_code == 200, back_to_http.text
    r = chat(fetching, via_https("http://10.1.2.3/x.png"))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "image_url_not_allowed"
    r = chat(fetching, via_https(f"{origins.stranger}/picture.png"))
    assert r.status_code == 400, r.text
    assert "certificate" in r.json()["error"]["message"]

