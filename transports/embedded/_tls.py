"""Server-side TLS upgrade at exactly the byte the core says (after the IDENTIFY answer)."""

from __future__ import annotations

import ssl
from typing import Any

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream

from nsq_sansio.errors import ConfigError

from .errors import TLSFileError

__all__ = ["PrefixedStream", "server_ssl_context", "start_server_tls"]


class PrefixedStream(anyio.abc.ByteStream):
    """A byte stream that first yields ``prefix`` (bytes already read), then the inner stream."""

    def __init__(self, inner: anyio.abc.ByteStream, prefix: bytes) -> None:
        self._inner = inner
        self._prefix = prefix

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix[:max_bytes], self._prefix[max_bytes:]
            return data
        return await self._inner.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self._inner.send(item)

    async def send_eof(self) -> None:
        await self._inner.send_eof()

    async def aclose(self) -> None:
        await self._inner.aclose()

    @property
    def extra_attributes(self) -> Any:
        return self._inner.extra_attributes


def server_ssl_context(
    cert: str, key: str, *, root_ca_file: str | None = None, client_auth_policy: str | None = None
) -> ssl.SSLContext:
    """A TLS server context from PEM files (TLS 1.2+).

    ``client_auth_policy="require-verify"`` (nsqd's flag value) asks every client for a
    certificate signed by ``root_ca_file`` (by the system's CAs without one, as nsqd does)
    and refuses the handshake otherwise. A file that cannot be loaded is one
    :class:`~transports.embedded.errors.TLSFileError` naming it (``ssl`` names none).
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ValueError) as exc:
        raise TLSFileError(f"tls_cert {cert!r} / tls_key {key!r}", exc) from exc
    if root_ca_file is not None:
        try:
            ctx.load_verify_locations(root_ca_file)
        except (OSError, ValueError) as exc:
            raise TLSFileError(f"tls_root_ca_file {root_ca_file!r}", exc) from exc
    if client_auth_policy is not None:
        if client_auth_policy != "require-verify":
            raise ConfigError(
                f"tls_client_auth_policy {client_auth_policy!r} is not supported here (only "
                "'require-verify': Python's ssl cannot ask for a client certificate without "
                "verifying it)"
            )
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def start_server_tls(
    stream: anyio.abc.ByteStream, trailing: bytes, context: ssl.SSLContext
) -> TLSStream:
    """Run the server handshake on ``stream``, feeding ``trailing`` bytes to it first."""
    inner: anyio.abc.ByteStream = PrefixedStream(stream, trailing) if trailing else stream
    return await TLSStream.wrap(
        inner, server_side=True, ssl_context=context, standard_compatible=False
    )
