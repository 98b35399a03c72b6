"""The anyio consumer's sockets: one task per nsqd connection (connect, read, and a writer
task), one per lookupd request.

:class:`ConsumerConnections` is a part of :class:`~transports.anyio.consumer.Consumer` (its
base class): the reader feeds each chunk of up to 64 KiB to the coordinator and dispatches
what it decided, and pauses while more messages wait for user code than ``max_in_flight``
(:meth:`ConsumerConnections._pause_reading`); the writer sends everything queued for its
connection since it last ran in one write; a lookupd request's task writes the request and
feeds the answer back. Errors end the connection (the coordinator decides about
reconnecting), never the consumer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from nsq_sansio.consumer import ConsumerCoordinator, Deliver, SendHTTPRequest
from nsq_sansio.discovery import LookupdAddress, NSQDAddress
from nsq_sansio.errors import ConnectionLost, NSQError
from transports._common import READ_SIZE, ConnectionLogger, TransportOptions
from transports._common.logs import fields

from ._net import SOCKET_ERRORS, connect, start_tls

__all__ = ["ConsumerConnections"]

#: What ends a connection's tasks quietly (anything else is logged with its traceback).
_SOCKET_ERRORS = (*SOCKET_ERRORS, ConnectionLost)

#: How often a paused reader looks whether user code took enough messages to read again:
#: polled, so that taking a message (the per-message path) does not pay for the pause.
_RESUME_POLL = 0.02


class Conn:
    """One nsqd connection's task state: its stream, what waits to be written, its bytes."""

    __slots__ = (
        "address",
        "bytes_in",
        "bytes_out",
        "closing",
        "conn_id",
        "log",
        "out",
        "scope",
        "send_lock",
        "stream",
        "tls_pending",
        "wake",
    )

    def __init__(self, conn_id: int, address: NSQDAddress, log: ConnectionLogger) -> None:
        self.conn_id = conn_id
        self.address = address
        self.log = log
        self.stream: anyio.abc.ByteStream | None = None
        self.out: list[bytes] = []
        self.wake = anyio.Event()
        self.closing = False
        self.scope = anyio.CancelScope()
        self.send_lock = anyio.Lock()
        self.tls_pending: bytes | None = None
        self.bytes_in = 0
        self.bytes_out = 0


class ConsumerConnections:
    """The tasks that own the consumer's sockets (a base class of ``Consumer``)."""

    # What they use of the consumer (set by Consumer.__init__):
    _coord: ConsumerCoordinator
    _options: TransportOptions
    _conns: dict[int, Conn]
    _inbox: deque[Deliver]
    _http: dict[int, anyio.CancelScope]

    if TYPE_CHECKING:

        def _spawn(self, func: Callable[..., Awaitable[Any]], *args: Any) -> None: ...

        def _dispatch(self) -> int: ...

        def _log_for(self, address: object) -> ConnectionLogger: ...

    def _open_connection(self, conn_id: int, address: NSQDAddress) -> None:
        conn = Conn(conn_id, address, self._log_for(address))
        self._conns[conn_id] = conn
        self._spawn(self._connection, conn)

    async def _connection(self, conn: Conn) -> None:
        coord = self._coord
        options: TransportOptions = self._options
        try:
            with conn.scope:
                try:
                    stream = await connect(
                        conn.address.host, conn.address.port, options.connect_timeout
                    )
                except ConnectionLost as exc:
                    coord.connection_failed(conn.conn_id, exc, monotonic())
                    self._dispatch()
                    return
                conn.stream = stream
                coord.connection_made(conn.conn_id, monotonic())
                conn.log.debug("connected", extra=fields(state="connected", conn_id=conn.conn_id))
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._writer, conn, tg.cancel_scope)
                    self._dispatch()
                    try:
                        await self._reader(conn)
                    except Exception as exc:  # socket errors; anything else is logged too
                        if not isinstance(exc, _SOCKET_ERRORS):
                            conn.log.exception(
                                "unexpected error; closing the connection",
                                extra=fields(conn_id=conn.conn_id, error=exc),
                            )
                        if conn.conn_id in self._conns and not conn.closing:
                            coord.connection_failed(conn.conn_id, exc, monotonic())
                            self._dispatch()
                        tg.cancel_scope.cancel()
        finally:
            self._conns.pop(conn.conn_id, None)
            self._forget_waiting(conn.conn_id)
            if conn.stream is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.aclose_forcefully(conn.stream)

    def _forget_waiting(self, conn_id: int) -> None:
        """A closed connection's messages still waiting for user code are dropped now (they
        would be skipped when taken: nsqd requeues them), so that a peer refused and
        reconnected again and again cannot pile them up while user code takes none."""
        inbox = self._inbox
        if any(delivery.conn_id == conn_id for delivery in inbox):
            kept = [delivery for delivery in inbox if delivery.conn_id != conn_id]
            inbox.clear()
            inbox.extend(kept)

    async def _reader(self, conn: Conn) -> None:
        coord = self._coord
        conn_id = conn.conn_id
        dispatch = self._dispatch
        inbox = self._inbox
        stream = conn.stream
        assert stream is not None
        receive = stream.receive
        while True:
            if conn.tls_pending is not None:
                trailing, conn.tls_pending = conn.tls_pending, None
                tls = self._options.tls
                async with conn.send_lock:
                    stream = await start_tls(
                        stream,
                        self._options.ssl_context(),
                        tls.server_hostname(conn.address.host),
                        trailing,
                        self._options.connect_timeout,
                        address=str(conn.address),
                    )
                conn.stream = stream
                receive = stream.receive
                coord.tls_established(conn_id, monotonic())
                dispatch()
            try:
                data = await receive(READ_SIZE)
            except anyio.EndOfStream:
                data = b""
            conn.bytes_in += len(data)
            coord.receive_data(conn_id, data, monotonic())
            dispatch()
            if len(inbox) > coord.max_in_flight and data:
                await self._pause_reading(conn)
            if not data:
                # The coordinator has closed it (CloseConnection); the writer flushes and ends
                # the task, even if nothing was decided.
                conn.closing = True
                conn.wake.set()
                await anyio.sleep_forever()

    async def _pause_reading(self, conn: Conn) -> None:
        """More messages wait for user code than ``max_in_flight``: read this connection again
        once they are no more than that, or after the core's ``read_pause_limit`` (heartbeats
        must be answered), whichever comes first. Checked once per read, never per message: a
        peer that ignores RDY is read no faster than user code takes messages, but for one
        read (within the RDY bound) per pause."""
        coord = self._coord
        limit = coord.read_pause_limit(conn.conn_id)
        if limit is None:  # not subscribed: a handshake is never held up
            return
        inbox = self._inbox
        resume_at = monotonic() + limit
        while len(inbox) > coord.max_in_flight and not conn.closing:
            left = resume_at - monotonic()
            if left <= 0:
                return
            await anyio.sleep(min(left, _RESUME_POLL))

    async def _writer(self, conn: Conn, scope: anyio.CancelScope) -> None:
        coord = self._coord
        try:
            while True:
                await conn.wake.wait()
                conn.wake = anyio.Event()
                out = conn.out
                while out:
                    data = out[0] if len(out) == 1 else b"".join(out)
                    out.clear()
                    stream = conn.stream
                    assert stream is not None
                    async with conn.send_lock:
                        await conn.stream.send(data)  # type: ignore[union-attr]
                    conn.bytes_out += len(data)
                if conn.closing:
                    scope.cancel()
                    return
        except Exception as exc:
            if not isinstance(exc, _SOCKET_ERRORS):
                conn.log.exception(
                    "unexpected error while writing; closing the connection",
                    extra=fields(conn_id=conn.conn_id, error=exc),
                )
            if conn.conn_id in self._conns and not conn.closing:
                coord.connection_failed(conn.conn_id, exc, monotonic())
                self._dispatch()
            scope.cancel()

    # --- internals: lookupd --------------------------------------------------------------------

    async def _http_request(self, action: SendHTTPRequest, scope: anyio.CancelScope) -> None:
        coord = self._coord
        lookupd: LookupdAddress = action.lookupd
        request_id = action.request_id
        stream: anyio.abc.ByteStream | None = None
        try:
            with scope:
                try:
                    stream = await connect(
                        lookupd.host, lookupd.port, self._options.connect_timeout
                    )
                    if lookupd.tls:
                        stream = await start_tls(
                            stream,
                            self._options.ssl_context(),
                            self._options.tls.server_hostname(lookupd.host),
                            b"",
                            self._options.connect_timeout,
                            address=str(lookupd),
                        )
                    await stream.send(action.data)
                    while True:
                        try:
                            data = await stream.receive(READ_SIZE)
                        except anyio.EndOfStream:
                            data = b""
                        coord.http_data(request_id, data, monotonic())
                        self._dispatch()
                        if not data:
                            break
                except (*_SOCKET_ERRORS, NSQError) as exc:
                    coord.http_failed(request_id, exc, monotonic())
                    self._dispatch()
        finally:
            self._http.pop(request_id, None)
            if stream is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.aclose_forcefully(stream)
