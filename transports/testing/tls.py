"""A throwaway self-signed certificate for 127.0.0.1, for tests and the demo's ``--tls``:
made with the ``cryptography`` package when installed, else the ``openssl`` binary.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

__all__ = ["self_signed_certificate"]


@contextlib.contextmanager
def self_signed_certificate() -> Iterator[tuple[str, str]]:
    """A throwaway certificate for 127.0.0.1 in a temporary directory: (cert, key) paths.

    Uses the ``cryptography`` package when installed, else the ``openssl`` binary."""
    directory = tempfile.mkdtemp(prefix="nsq-sansio-demo-tls-")
    try:
        cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
        try:
            _cryptography_cert(cert, key)
        except ImportError:
            _openssl_cert(cert, key)
        yield cert, key
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _cryptography_cert(cert_path: str, key_path: str) -> None:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def _openssl_cert(cert_path: str, key_path: str) -> None:
    import subprocess

    try:
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                key_path,
                "-out",
                cert_path,
            ],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as err:
        raise RuntimeError(
            "--tls needs a certificate: install the 'cryptography' package or an openssl binary"
        ) from err
