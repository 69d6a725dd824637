"""Certificates for the TLS tests, made with `cryptography`: a CA, a server certificate for
127.0.0.1 and localhost, and a client certificate, all signed by the CA (EC P-256, one day).

    certs = make_certs(tmp_path)   # certs.ca, certs.cert, certs.key, certs.client_cert, certs.client_key
    certs.client_context()         # an ssl.SSLContext trusting the CA (with the client certificate: mutual=True)
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path

    def client_context(self, *, mutual: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if mutual:
            ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey, issuer: str, *,
           ca: bool = False, sans: list[x509.GeneralName] | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def make_certs(folder: Path, server_name: str = "streamproxy test") -> Certs:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("streamproxy test CA", ca_key, ca_key, "streamproxy test CA", ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = _issue(server_name, key, ca_key, "streamproxy test CA", sans=sans)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _issue("client", client_key, ca_key, "streamproxy test CA")
    out = Certs(folder / "ca.pem", folder / "cert.pem", folder / "key.pem", folder / "client.pem", folder / "client-key.pem")
    out.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    _write_key(key, out.key)
    _write_key(client_key, out.client_key)
    return out
