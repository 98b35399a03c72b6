"""A private CA for the TLS tests: a server certificate for 127.0.0.1 / localhost /
nsqd.test and a client certificate, both signed by it (needs ``cryptography``)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TestCA:
    """PEM file paths."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    ca_file: str
    cert_file: str
    key_file: str
    client_cert_file: str
    client_key_file: str

    def as_dict(self) -> dict[str, str]:
        """The blocking tests' shape: ca, cert, key, client_cert, client_key."""
        return {
            "ca": self.ca_file,
            "cert": self.cert_file,
            "key": self.key_file,
            "client_cert": self.client_cert_file,
            "client_key": self.client_key_file,
        }


def make_test_ca(directory: Path) -> TestCA:
    """Write a fresh CA, a server and a client certificate (with keys) into ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def write_key(key: Any, name: str) -> str:
        path = directory / name
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return str(path)

    def write_cert(cert: Any, name: str) -> str:
        path = directory / name
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return str(path)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nsq-sansio test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common_name: str, server: bool) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
        )
        if server:
            names = [
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.DNSName("localhost"),
                x509.DNSName("nsqd.test"),
            ]
            builder = builder.add_extension(
                x509.SubjectAlternativeName(names), critical=False
            ).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
        else:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
        return builder.sign(ca_key, hashes.SHA256()), key

    server_cert, server_key = leaf("127.0.0.1", server=True)
    client_cert, client_key = leaf("nsq-sansio client", server=False)
    return TestCA(
        ca_file=write_cert(ca_cert, "ca.pem"),
        cert_file=write_cert(server_cert, "server.pem"),
        key_file=write_key(server_key, "server.key"),
        client_cert_file=write_cert(client_cert, "client.pem"),
        client_key_file=write_key(client_key, "client.key"),
    )
