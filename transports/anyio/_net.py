"""Socket helpers for the anyio transport: connect with a timeout, the TLS upgrade, the errors
a broken socket raises, and the plain socket under a stream (the producer writes to it)."""

from __future__ import annotations

import os
import socket
import ssl

import anyio
import anyio.abc
import anyio.streams.tls
from anyio.streams.tls import TLSStream

from nsq_sansio.errors import ConnectionLost
from transports._common.addresses import format_address
from transports._common.failures import connect_failed, connect_timed_out, seconds, tls_failed

__all__ = ["SOCKET_ERRORS", "PrefixedStream", "connect", "plain_socket", "start_tls"]

#: What a broken or closed connection raises from a stream (a ``ConnectionLost`` aside).
SOCKET_ERRORS = (
    OSError,
    ssl.SSLError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


async def connect(host: str, port: int, timeout: float) -> anyio.abc.SocketStream:
    """TCP connect (TCP_NODELAY is set by anyio); a timeout or refusal -> ConnectionLost
    (``host:port: connection refused``, chained to the socket's error)."""
    try:
        with anyio.fail_after(timeout):
            return await anyio.connect_tcp(host, port)
    except TimeoutError:
        raise connect_timed_out(format_address(host, port), timeout) from None
    except OSError as exc:
        # anyio raises one OSError for every address it tried, caused by their errors (a
        # group when there were several): the first says why.
        cause: BaseException = exc
        inner = exc.__cause__
        if isinstance(inner, OSError):
            cause = inner
        elif inner is not None and getattr(inner, "exceptions", None):
            cause = inner.exceptions[0]  # type: ignore[attr-defined]
        raise connect_failed(format_address(host, port), cause) from cause


class PrefixedStream(anyio.abc.ByteStream):
    """A byte stream that first returns ``prefix`` (bytes already read for the next layer)."""

    def __init__(self, stream: anyio.abc.ByteStream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix[:max_bytes], self._prefix[max_bytes:]
            return data
        return await self._stream.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self._stream.send(item)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()

    @property
    def extra_attributes(self):  # type: ignore[no-untyped-def]
        return self._stream.extra_attributes


async def start_tls(
    stream: anyio.abc.ByteStream,
    context: ssl.SSLContext,
    server_hostname: str | None,
    trailing_data: bytes,
    timeout: float,
    *,
    address: str,
) -> TLSStream:
    """Run the client handshake over ``stream`` (after nsqd's IDENTIFY answer); a failure ->
    ConnectionLost (``host:port: TLS handshake failed: ...``, chained)."""
    transport: anyio.abc.ByteStream = stream
    if trailing_data:
        transport = PrefixedStream(stream, trailing_data)
    try:
        with anyio.fail_after(timeout):
            return await TLSStream.wrap(
                transport,
                server_side=False,
                hostname=server_hostname,
                ssl_context=context,
                standard_compatible=False,
            )
    except TimeoutError:
        raise ConnectionLost(
            f"{address}: TLS handshake timed out after {seconds(timeout)}"
        ) from None
    except (ssl.SSLError, OSError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
        if isinstance(exc, anyio.BrokenResourceError | anyio.EndOfStream):
            cause: BaseException = ConnectionLost("nsqd closed the connection")
        else:
            cause = exc
        raise tls_failed(address, cause) from exc


def plain_socket(stream: anyio.abc.ByteStream) -> tuple[socket.socket | None, bool]:
    """The stream's socket when it is plain TCP (TLS: None, the stream must encrypt), and
    whether it is a duplicate to close. The producer writes to it directly (never through the
    stream, so nothing can overtake), which saves a task switch per write."""
    if stream.extra(anyio.streams.tls.TLSAttribute.ssl_object, None) is not None:
        return None, False
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if raw is None:
        return None, False
    if isinstance(raw, socket.socket):
        return raw, False
    # asyncio hands out a TransportSocket (no send()): duplicate the descriptor instead. The
    # transport never writes (the producer never calls stream.send on plain TCP), and must not
    # read either: anyio pauses it between receive() calls; where that cannot be seen, the
    # producer stays on the stream.
    transport = getattr(stream, "_transport", None)
    is_reading = getattr(transport, "is_reading", None)
    if is_reading is None or is_reading():
        return None, False
    try:
        dup = socket.socket(raw.family, raw.type, raw.proto, fileno=os.dup(raw.fileno()))
    except (OSError, AttributeError):
        return None, False
    dup.setblocking(False)
    return dup, True
