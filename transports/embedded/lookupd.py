"""An embedded nsqlookupd: the pure :class:`~nsq_sansio.server.lookupd.Lookupd` over anyio sockets.

TCP lookup protocol V1 on one port, the HTTP API (h11) on another. Use it as an async context
manager from anyio code (asyncio or trio); ports default to 0 and the real ones are exposed::

    async with EmbeddedLookupd() as lookupd:
        print(lookupd.http_url)          # http://127.0.0.1:54321
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from nsq_sansio.server.lookupd import (
    ClientClosed,
    LookupConnState,
    Lookupd,
    LookupdAPIError,
    LookupdOptions,
)
from transports._common.logs import fields

from ._clock import LoopClock
from ._net import (
    ListenerAddresses,
    abandon_task_group,
    bind,
    local_port,
    parse_address,
    remote_address,
)
from .http import (
    HTTPLimits,
    HTTPRequest,
    HTTPResponse,
    empty_response,
    error_response,
    json_response,
    method_not_routed,
    plain_text_response,
    serve_http_connection,
)

_log = logging.getLogger("nsq_sansio.embedded.lookupd")

__all__ = ["EmbeddedLookupd"]

#: Commands of one TCP connection run per step (64 KiB of PINGs is 13,000 commands, about 60 ms
#: of work; 256 take about a millisecond): other connections and the HTTP API are served
#: between steps. An nsqd sends a few commands at a time.
STEP_COMMANDS = 256


class EmbeddedLookupd(ListenerAddresses):
    """A runnable nsqlookupd for tests, demos and local development."""

    def __init__(
        self,
        *,
        tcp_address: str = "127.0.0.1:0",
        http_address: str = "127.0.0.1:0",
        broadcast_address: str | None = None,
        hostname: str | None = None,
        inactive_producer_timeout: float = 300.0,
        tombstone_lifetime: float = 45.0,
    ) -> None:
        self._tcp_address = tcp_address
        self._http_address = http_address
        self._broadcast_address = broadcast_address
        self._hostname = hostname or socket.gethostname()
        self._inactive_producer_timeout = inactive_producer_timeout
        self._tombstone_lifetime = tombstone_lifetime
        self._core: Lookupd | None = None
        self._tcp_listener: anyio.abc.SocketListener | None = None
        self._http_listener: anyio.abc.SocketListener | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._tcp_port = 0
        self._http_port = 0
        self._host = "127.0.0.1"
        self._clock = LoopClock()
        self._http_limits = HTTPLimits()

    # -- addresses ------------------------------------------------------------------------------

    @property
    def core(self) -> Lookupd:
        """The pure lookupd role (the registry), for inspection."""
        if self._core is None:
            raise RuntimeError("EmbeddedLookupd is not running (use 'async with')")
        return self._core

    def now(self) -> float:
        """The server loop's clock, the ``now`` its :attr:`core` takes; callable from any
        thread or event loop (a trio test's ``anyio.current_time()`` is not the server's)."""
        return self._clock.now()

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Bind both ports and serve in ``task_group`` (which owns the server's lifetime)."""
        self._tcp_listener = await bind(self._tcp_address, "tcp_address")
        try:
            self._http_listener = await bind(self._http_address, "http_address")
        except BaseException:
            await self._tcp_listener.aclose()
            raise
        self._tcp_port = local_port(self._tcp_listener)
        self._http_port = local_port(self._http_listener)
        self._host = parse_address(self._tcp_address)[0]
        self._clock.bind()
        self._core = Lookupd(
            LookupdOptions(
                broadcast_address=self._broadcast_address or self._connect_host(),
                hostname=self._hostname,
                tcp_port=self._tcp_port,
                http_port=self._http_port,
                inactive_producer_timeout=self._inactive_producer_timeout,
                tombstone_lifetime=self._tombstone_lifetime,
                max_commands_per_step=STEP_COMMANDS,
            )
        )
        task_group.start_soon(self._tcp_listener.serve, self._handle_tcp)
        task_group.start_soon(self._http_listener.serve, self._handle_http)

    async def aclose(self) -> None:
        """Close the listeners (connections end with the task group)."""
        for listener in (self._tcp_listener, self._http_listener):
            if listener is not None:
                with anyio.CancelScope(shield=True):
                    await listener.aclose()

    async def __aenter__(self) -> EmbeddedLookupd:
        """Start serving; a failure to start is one plain exception (a
        :class:`~transports.embedded.errors.ListenError` for a port in use), not a group."""
        self._task_group = tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            await self.start(tg)
        except BaseException:
            self._task_group = None
            await abandon_task_group(tg, self.aclose)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._task_group is None:
            raise RuntimeError("EmbeddedLookupd.__aexit__ without __aenter__")
        self._task_group.cancel_scope.cancel()
        try:
            return await self._task_group.__aexit__(exc_type, exc, tb)
        finally:
            await self.aclose()
            self._task_group = None

    # -- TCP ------------------------------------------------------------------------------------

    async def _handle_tcp(self, stream: anyio.abc.SocketStream) -> None:
        core = self.core
        handle = core.connect(remote_address(stream), anyio.current_time())
        try:
            while core.connection_state(handle) is not LookupConnState.CLOSED:
                try:
                    data = await stream.receive(65536)
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    data = b""
                events = core.receive_data(handle, data, anyio.current_time())
                while True:
                    out = core.data_to_send(handle)
                    if out:
                        await stream.send(out)
                    if any(isinstance(e, ClientClosed) for e in events):
                        return
                    if not core.input_pending(handle):
                        break
                    # a bounded step at a time: every other connection is served between
                    # steps, and this one is not read again until its input is done
                    await anyio.lowlevel.checkpoint()
                    events = core.continue_input(handle, anyio.current_time())
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        except Exception:  # a bug must cost one connection, never the server
            _log.exception("nsqlookupd: connection %d failed", handle, extra=fields(conn_id=handle))
        finally:
            core.release(handle)
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await stream.aclose()

    # -- HTTP -----------------------------------------------------------------------------------

    async def _handle_http(self, stream: anyio.abc.SocketStream) -> None:
        await serve_http_connection(
            stream, self._route, max_body=1024 * 1024, limits=self._http_limits
        )

    async def _route(self, request: HTTPRequest) -> HTTPResponse:
        now = anyio.current_time()
        return route_lookupd(self.core, request, now, time.time() - now)


_GET = frozenset({"GET"})
_POST = frozenset({"POST"})
#: nsqlookupd's HTTP routes and the methods each takes.
LOOKUPD_ROUTES: dict[str, frozenset[str]] = {
    "/ping": _GET,
    "/info": _GET,
    "/debug": _GET,
    "/lookup": _GET,
    "/topics": _GET,
    "/channels": _GET,
    "/nodes": _GET,
    "/topic/create": _POST,
    "/topic/delete": _POST,
    "/channel/create": _POST,
    "/channel/delete": _POST,
    "/topic/tombstone": _POST,
}


def route_lookupd(
    core: Lookupd, request: HTTPRequest, now: float, epoch_offset: float = 0.0
) -> HTTPResponse:
    """Answer one nsqlookupd HTTP API request from the pure core (``epoch_offset`` turns the
    core's clock into wall-clock time for ``/debug``)."""
    path = request.path
    refused = method_not_routed(LOOKUPD_ROUTES, request)
    if refused is not None:
        return refused
    try:
        result: Any = None
        if path == "/ping":
            return plain_text_response("OK")
        if path == "/info":
            result = core.info()
        elif path == "/debug":
            result = core.debug(now, epoch_offset)
        elif path == "/lookup":
            result = core.lookup(request.arg("topic"), now)
        elif path == "/topics":
            result = core.topics()
        elif path == "/channels":
            result = core.channels(request.arg("topic"))
        elif path == "/nodes":
            result = core.nodes(now)
        elif path == "/topic/create":
            core.create_topic(request.arg("topic"))
        elif path == "/topic/delete":
            core.delete_topic(request.arg("topic"))
        elif path == "/channel/create":
            core.create_channel(request.arg("topic"), request.arg("channel"))
        elif path == "/channel/delete":
            core.delete_channel(request.arg("topic"), request.arg("channel"))
        elif path == "/topic/tombstone":
            core.tombstone_topic_producer(request.arg("topic"), request.arg("node"), now)
    except LookupdAPIError as err:
        return error_response(err.status, err.message)
    if result is None:
        return empty_response()
    return json_response(result)
