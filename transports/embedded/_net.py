"""Address parsing, listener helpers and stream cleanup shared by the embedded servers."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
import h11
from anyio.abc import SocketAttribute

from .errors import ListenError

__all__ = [
    "IO_ERRORS",
    "abandon_task_group",
    "aclose_quietly",
    "bind",
    "format_address",
    "local_port",
    "parse_address",
    "read_http_answer",
    "remote_address",
]


def parse_address(address: str, default_port: int = 0) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` / ``:port`` -> (host, port); empty host means all IPv4."""
    address = address.strip()
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif address.count(":") == 1:
        host, _, port_text = address.partition(":")
    elif ":" in address:  # bare IPv6 literal
        host, port_text = address, ""
    else:
        host, port_text = address, ""
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ValueError(f"invalid port in address {address!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range in address {address!r}")
    return host or "0.0.0.0", port


def format_address(host: str, port: int) -> str:
    """The inverse of :func:`parse_address`."""
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


async def bind(address: str, option: str) -> anyio.abc.SocketListener:
    """Listen on exactly one TCP socket (port 0 picks a free port). A failure is one
    :class:`~transports.embedded.errors.ListenError` naming ``address`` and the ``option``
    that gave it (``tcp_address``...), whatever anyio raised (a group when it tried several
    addresses)."""
    host, port = parse_address(address)
    try:
        listener = await anyio.create_tcp_listener(
            local_host=host, local_port=port, reuse_port=False, family=socket.AF_UNSPEC
        )
    except OSError as exc:
        raise ListenError(address, option, exc) from exc
    except Exception as exc:  # a group of one error per address tried (3.10: the backport's)
        cause = _first_os_error(exc)
        if cause is None:
            raise
        raise ListenError(address, option, cause) from exc
    listeners = listener.listeners
    for extra in listeners[1:]:  # "localhost" may resolve to two families; keep the first
        await extra.aclose()
    first = listeners[0]
    if not isinstance(first, anyio.abc.SocketListener):
        raise TypeError(f"unexpected listener type {type(first).__name__}")
    return first


def _first_os_error(exc: BaseException) -> OSError | None:
    """The first ``OSError`` in (nested) exception groups, or None."""
    if isinstance(exc, OSError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _first_os_error(inner)
        if found is not None:
            return found
    return None


def local_port(listener: anyio.abc.SocketListener) -> int:
    return int(listener.extra(SocketAttribute.local_port))


def remote_address(stream: anyio.abc.SocketStream) -> str:
    """``host:port`` of the peer of a socket stream."""
    try:
        addr = stream.extra(SocketAttribute.remote_address)
    except Exception:
        return "unknown:0"
    if isinstance(addr, tuple):
        return format_address(str(addr[0]), int(addr[1]))
    return str(addr)


class ListenerAddresses:
    """The ports and connectable addresses of a server's TCP and HTTP listeners.

    Subclasses set ``_host``, ``_tcp_port`` and ``_http_port`` once they are bound (port 0 in
    tests: the real ports are known only then).
    """

    _host: str
    _tcp_port: int
    _http_port: int

    @property
    def tcp_port(self) -> int:
        return self._tcp_port

    @property
    def http_port(self) -> int:
        return self._http_port

    @property
    def tcp_address(self) -> str:
        """``host:port`` of the TCP listener (what clients and ``--lookupd-tcp-address`` take)."""
        return format_address(self._connect_host(), self._tcp_port)

    @property
    def http_address(self) -> str:
        return format_address(self._connect_host(), self._http_port)

    @property
    def http_url(self) -> str:
        """``http://host:port``: what consumers' ``lookupd=[...]`` takes."""
        return f"http://{self.http_address}"

    def _connect_host(self) -> str:
        """A wildcard bind address is reached through loopback."""
        if self._host in ("0.0.0.0", ""):
            return "127.0.0.1"
        if self._host == "::":
            return "::1"
        return self._host


#: What a read or write on a client's stream raises when the peer is gone.
IO_ERRORS = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
    ssl.SSLError,
)


async def abandon_task_group(
    task_group: anyio.abc.TaskGroup, cleanup: Callable[[], Awaitable[None]]
) -> None:
    """Undo a start that failed inside ``task_group`` (already entered): cancel what it
    started, wait for it, then ``cleanup()``. The caller re-raises its own error alone:
    what the cancelled tasks raise on the way out (a listener closed under ``accept``) is a
    consequence of the failure, not news, and is not wrapped around it in a group."""
    task_group.cancel_scope.cancel()
    try:
        await task_group.__aexit__(None, None, None)
    except Exception:  # consequences of the failure being raised
        pass
    finally:
        with anyio.CancelScope(shield=True):
            await cleanup()


async def aclose_quietly(stream: anyio.abc.AsyncResource) -> None:
    """Close a stream, ignoring errors and outside cancellation (for cleanup paths)."""
    with anyio.CancelScope(shield=True):
        with contextlib.suppress(Exception):
            await stream.aclose()


async def read_http_answer(
    stream: anyio.abc.ByteStream, conn: h11.Connection, *, limit: int, error: type[Exception]
) -> tuple[int, bytes]:
    """Read one HTTP answer on ``conn`` (h11, client side): its status and body. A body over
    ``limit`` bytes, or a connection closed before the answer ended, raises ``error``."""
    status = 0
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                chunk = await stream.receive(65536)
            except anyio.EndOfStream:
                chunk = b""
            conn.receive_data(chunk)
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > limit:
                raise error(f"answer larger than {limit} bytes")
        elif isinstance(event, h11.EndOfMessage):
            return status, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            raise error("connection closed before the answer ended")
