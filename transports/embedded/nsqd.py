"""An embedded nsqd: the pure :class:`~nsq_sansio.server.nsqd.NSQD` over anyio sockets.

Protocol V2 on one TCP port, the HTTP API (h11) on another, optional TLS upgrade at the byte
the core asks for, and registration with every configured nsqlookupd. One reader and one
writer task per client; a publish on one connection wakes the writers of the consumers it
fed (``NSQD.connections_with_output``); one timer task serves ``next_deadline``::

    async with EmbeddedNSQD(lookupd_tcp_addresses=[lookupd.tcp_address]) as nsqd:
        print(nsqd.tcp_address, nsqd.http_address)

This module serves the sockets: TCP clients (reader, writer, TLS upgrade), the timer task and
the HTTP(S) listeners. What an HTTP request means is :mod:`.nsqd_http`; the registration with
each nsqlookupd is :mod:`.registration`; ``/stats``' memory figures are :mod:`.memory`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.tls import TLSStream

from nsq_sansio.errors import ConfigError, LocalProtocolError
from nsq_sansio.server.backend import BackendFactory
from nsq_sansio.server.events import (
    AdminError,
    AuthRequested,
    ChannelCreated,
    ChannelDeleted,
    CloseConnection,
    LookupChannels,
    ServerEvent,
    StartTLS,
    TopicCreated,
    TopicDeleted,
)
from nsq_sansio.server.lookupd_client import (
    LookupPeer,
    NodeIdentity,
)
from nsq_sansio.server.nsqd import NSQD, ClientState
from nsq_sansio.server.options import AuthState, NSQDOptions
from nsq_sansio.server.quantile import go_number
from transports._common.logs import fields

from ._clock import LoopClock
from ._net import (
    IO_ERRORS,
    ListenerAddresses,
    abandon_task_group,
    aclose_quietly,
    bind,
    format_address,
    local_port,
    parse_address,
    remote_address,
)
from ._tls import server_ssl_context, start_server_tls
from .auth import parse_auth_address, query_auth
from .file_backend import FileBackendFactory, load_metadata, save_metadata
from .http import (
    HTTPLimits,
    HTTPRequest,
    HTTPResponse,
    error_response,
    json_response,
    method_not_routed,
    serve_http_connection,
    text_response,
)
from .memory import install_gc_pause_recorder, memory_stats
from .nsqd_http import (
    CONFIG_DURATIONS,
    CONFIG_METHODS,
    CONFIG_OPTION_NAMES,
    LOG_LEVELS,
    NSQD_ROUTES,
    PYTHON_LOG_LEVELS,
    route_nsqd,
)
from .registration import query_lookupd_channels, serve_lookupd_peer

# NSQD_ROUTES, route_nsqd and memory_stats live in .nsqd_http and .memory (re-exported here).
__all__ = ["NSQD_ROUTES", "EmbeddedNSQD", "memory_stats", "route_nsqd"]

_log = logging.getLogger("nsq_sansio.embedded.nsqd")

_OPTION_NAMES = {f.name for f in dataclasses.fields(NSQDOptions)}
# The timer task runs the core's bounded steps (a backlog moving, a client's input) for at most
# this long before it lets every other task run: short enough that /ping stays in the
# milliseconds, long enough that the steps are not paced by the event loop's iterations (one
# step per iteration moved a backlog at 44k msg/s while bench_reader drained the channel; with
# 1 ms, 340k msg/s, and /ping answered as fast as with one step per iteration before).
TIMER_SLICE = 0.001


class _Client:
    """Transport-side state of one TCP client."""

    __slots__ = (
        "closing",
        "conn_id",
        "drained",
        "input_done",
        "scope",
        "send_lock",
        "stream",
        "wake",
        "writer_done",
    )

    def __init__(self, conn_id: int, stream: anyio.abc.ByteStream) -> None:
        self.conn_id = conn_id
        self.stream = stream
        self.wake = anyio.Event()
        self.drained = anyio.Event()
        self.input_done = anyio.Event()  # set when the core has processed all its input
        self.writer_done = anyio.Event()
        self.send_lock = anyio.Lock()
        self.closing = False
        self.scope: anyio.CancelScope | None = None


class EmbeddedNSQD(ListenerAddresses):
    """A runnable nsqd for tests, demos and local development.

    Keyword arguments not listed are :class:`~nsq_sansio.server.options.NSQDOptions` fields
    (``mem_queue_size``, ``max_rdy_count``, ``msg_timeout`` ...), with nsqd's defaults.

    ``auth_http_addresses`` is nsqd's ``--auth-http-address`` (``host:port`` or a full
    ``http(s)://`` URL, several allowed): clients must AUTH, and each secret is checked with
    ``GET /auth?remote_ip=&tls=&secret=`` on those servers (h11 over anyio, at most
    ``auth_http_timeout`` seconds), again when the answer's ``ttl`` runs out; see
    :mod:`transports.embedded.auth`. An in-process check is ``auth_check=callable`` instead.

    ``http_limits`` are :class:`~transports.embedded.http.HTTPLimits` keyword arguments for
    the HTTP(S) API (connections at once, the whole-request deadline, request bodies held at
    once; see that class for the defaults).

    ``tls_required`` is nsqd's ``--tls-required``: ``True`` (TLS before any command but
    IDENTIFY, and the plain HTTP port answers 403) or ``"tcp-https"`` (TCP clients need TLS,
    the plain HTTP API stays open). ``tls_client_auth_policy="require-verify"`` (client
    certificates signed by ``tls_root_ca_file``, or by the system's CAs without one) turns
    ``tls_required`` on, as in nsqd. Like nsqd, it refuses to require TLS without
    ``tls_cert`` and ``tls_key`` (a :class:`~nsq_sansio.errors.ConfigError`), and so any
    other TLS option without them.

    Starting it (``async with``, :class:`Cluster`, :class:`ServerThread`) raises one plain
    exception when it cannot start: :class:`~transports.embedded.errors.ListenError` names
    the address and its option (``cannot listen on 127.0.0.1:4150 (tcp_address): Address
    already in use``), :class:`~transports.embedded.errors.TLSFileError` the certificate
    files that cannot be loaded.
    """

    def __init__(
        self,
        *,
        tcp_address: str = "127.0.0.1:0",
        http_address: str = "127.0.0.1:0",
        https_address: str | None = None,
        broadcast_address: str | None = None,
        hostname: str | None = None,
        lookupd_tcp_addresses: list[str] | tuple[str, ...] = (),
        data_path: str | os.PathLike[str] | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_required: bool | str = False,
        tls_root_ca_file: str | None = None,
        tls_client_auth_policy: str | None = None,
        seed: int | None = None,
        lookupd_ping_interval: float = 15.0,
        auth_http_addresses: Sequence[str] = (),
        auth_http_timeout: float = 5.0,
        http_limits: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        unknown = set(options) - _OPTION_NAMES
        if unknown:
            raise TypeError(f"unknown nsqd option(s): {', '.join(sorted(unknown))}")
        reserved_names = ("tcp_port", "http_port", "tls_available", "tls_required")
        for reserved in (*reserved_names, "auth_by_transport"):
            if reserved in options:
                raise TypeError(f"{reserved} is set from the addresses / TLS / auth arguments")
        tls_client_auth_policy = tls_client_auth_policy or None  # nsqd: "" is no policy
        self._tls_required, self._http_tls_required = _tls_required_mode(tls_required)
        _check_tls_options(
            tls_cert,
            tls_key,
            tls_root_ca_file,
            tls_client_auth_policy,
            tls_required=self._tls_required,
            https_address=https_address,
        )
        self._tcp_address = tcp_address
        self._http_address = http_address
        self._https_address = https_address
        self._broadcast_address = broadcast_address
        self._hostname = hostname or socket.gethostname()
        self._lookupd_addresses = list(lookupd_tcp_addresses)
        self._data_path = Path(data_path) if data_path is not None else None
        self._ssl_context = (
            server_ssl_context(
                tls_cert,
                tls_key,
                root_ca_file=tls_root_ca_file,
                client_auth_policy=tls_client_auth_policy,
            )
            if tls_cert and tls_key
            else None
        )
        if tls_client_auth_policy and not self._tls_required:
            # nsqd: a client-auth policy means TLS is required, of TCP and HTTP clients alike
            # (unless --tls-required said how)
            self._tls_required = self._http_tls_required = True
        self._seed = seed
        self._lookupd_ping_interval = lookupd_ping_interval
        self._options = options
        if isinstance(auth_http_addresses, str):
            auth_http_addresses = [auth_http_addresses]
        self._auth_addresses = list(auth_http_addresses)
        self._auth_urls = [parse_auth_address(a) for a in auth_http_addresses]
        if not auth_http_timeout > 0:
            raise ValueError(f"auth_http_timeout must be > 0 seconds, got {auth_http_timeout!r}")
        self._auth_timeout = auth_http_timeout
        # validate now, so a bad option fails at construction, not inside the event loop
        NSQDOptions(
            tls_available=self._ssl_context is not None,
            tls_required=self._tls_required,
            auth_by_transport=bool(self._auth_urls),
            **options,
        )
        self._core: NSQD | None = None
        self._tcp_listener: anyio.abc.SocketListener | None = None
        self._http_listener: anyio.abc.SocketListener | None = None
        self._https_listener: anyio.abc.SocketListener | None = None
        self._https_port = 0
        self._task_group: anyio.abc.TaskGroup | None = None
        self._serve_group: anyio.abc.TaskGroup | None = None  # the one start() serves in
        self._clients: dict[int, _Client] = {}
        # Readers paused until the core has processed the input they fed it.
        self._input_waiters: dict[int, _Client] = {}
        # anyio objects are made in start(), on the server's own loop: this constructor may
        # run on another thread or event loop (e.g. a trio test starting an asyncio server)
        self._timer_wake: anyio.Event | None = None
        self._timer_target = math.inf
        self._peers: list[tuple[LookupPeer, list[anyio.Event]]] = []
        # Set when a LookupChannels is over (an HTTP request that created the topic waits).
        self._lookups_done: dict[int, anyio.Event] = {}
        self._identity: NodeIdentity | None = None
        self._log_level = 2  # nsqd's INFO
        self._tcp_port = 0
        self._http_port = 0
        self._host = "127.0.0.1"
        self._clock = LoopClock()
        self._closed = False
        # the HTTP and HTTPS listeners' connection cap, whole-request deadline, body budget
        self._http_limits = HTTPLimits(**dict(http_limits or {}))
        self._https_limits = HTTPLimits(**dict(http_limits or {}))

    def __repr__(self) -> str:
        # addresses only: the auth addresses may carry tokens, and options are not needed
        return f"<EmbeddedNSQD tcp={self._tcp_address!r} http={self._http_address!r}>"

    # -- addresses ------------------------------------------------------------------------------

    @property
    def core(self) -> NSQD:
        """The pure nsqd role, for inspection (call it only from the server's event loop)."""
        if self._core is None:
            raise RuntimeError("EmbeddedNSQD is not running (use 'async with')")
        return self._core

    @property
    def https_port(self) -> int:
        """Port of the HTTPS API (0 when ``https_address`` was not given)."""
        return self._https_port

    @property
    def https_address(self) -> str | None:
        """``host:port`` of the HTTPS API, None when it was not asked for."""
        if not self._https_port:
            return None
        return format_address(self._connect_host(), self._https_port)

    @property
    def lookupd_peers(self) -> list[LookupPeer]:
        """The nsqd-side state of each configured nsqlookupd connection."""
        return [peer for peer, _ in self._peers]

    def core_has_topic(self, topic: str) -> bool:
        """Whether the server role holds ``topic`` now (tests use it to wait for a topic)."""
        return self._core is not None and topic in self._core.topic_names()

    def now(self) -> float:
        """The server loop's clock, the ``now`` its :attr:`core` takes; callable from any
        thread or event loop (a trio test's ``anyio.current_time()`` is not the server's)."""
        return self._clock.now()

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Bind both ports, build the core and serve in ``task_group``."""
        self._tcp_listener = await bind(self._tcp_address, "tcp_address")
        try:
            self._http_listener = await bind(self._http_address, "http_address")
        except BaseException:
            await self._tcp_listener.aclose()
            raise
        if self._https_address is not None:
            try:
                self._https_listener = await bind(self._https_address, "https_address")
            except BaseException:
                await self._tcp_listener.aclose()
                await self._http_listener.aclose()
                raise
            self._https_port = local_port(self._https_listener)
        self._tcp_port = local_port(self._tcp_listener)
        self._http_port = local_port(self._http_listener)
        self._host = parse_address(self._tcp_address)[0]
        options = NSQDOptions(
            tcp_port=self._tcp_port,
            http_port=self._http_port,
            broadcast_address=self._broadcast_address or self._connect_host(),
            hostname=self._hostname,
            tls_available=self._ssl_context is not None,
            tls_required=self._tls_required,
            auth_by_transport=bool(self._auth_urls),
            **self._options,
        )
        self._serve_group = task_group
        install_gc_pause_recorder()
        self._timer_wake = anyio.Event()
        self._clock.bind()
        now = anyio.current_time()
        rng = random.Random(self._seed)
        backend_factory = self._backend_factory()
        self._core = NSQD(
            options,
            rng,
            backend_factory=backend_factory,
            epoch_offset=time.time() - now,
            now=now,
        )
        self._load_metadata(now)
        identity = NodeIdentity(
            broadcast_address=options.broadcast_address,
            tcp_port=self._tcp_port,
            http_port=self._http_port,
            hostname=self._hostname,
            version=options.version,
        )
        self._identity = identity
        for address in self._lookupd_addresses:
            self._start_lookupd_peer(address)
        task_group.start_soon(self._tcp_listener.serve, self._handle_tcp)
        task_group.start_soon(self._http_listener.serve, self._handle_http)
        if self._https_listener is not None:
            task_group.start_soon(self._https_listener.serve, self._handle_https)
        task_group.start_soon(self._timer_loop)

    def _start_lookupd_peer(self, address: str) -> None:
        assert self._identity is not None and self._serve_group is not None
        peer = LookupPeer(address, self._identity, ping_interval=self._lookupd_ping_interval)
        wake: list[anyio.Event] = [anyio.Event()]
        self._peers.append((peer, wake))
        self._serve_group.start_soon(
            serve_lookupd_peer, peer, wake, self._registrations, self._lookupd_identified
        )

    def _lookupd_identified(self) -> None:
        """Tell the core which nsqlookupds to ask for a new topic's channels: the HTTP
        address of each that answered IDENTIFY (kept when its connection drops, as nsqd
        keeps it)."""
        if self._core is not None:
            self._core.set_lookupd_http_addresses(
                [
                    peer.info.http_address
                    for peer, _ in self._peers
                    if peer.info is not None and peer.info.broadcast_address
                ]
            )

    def _registrations(self) -> list[tuple[str, list[str]]]:
        """Every topic with its channels, announced to an nsqlookupd on (re)connection."""
        core = self.core
        return [(t, core.channel_names(t)) for t in core.topic_names()]

    def set_lookupd_addresses(self, addresses: Sequence[str]) -> None:
        """nsqd's ``PUT /config/nsqlookupd_tcp_addresses``: register with the nsqlookupds
        newly listed, drop the connections to those no longer listed (call it on the
        server's loop)."""
        wanted = list(dict.fromkeys(addresses))
        for peer, wake in list(self._peers):
            if peer.address not in wanted:
                peer.close()
                wake[0].set()
                self._peers.remove((peer, wake))
        known = {peer.address for peer, _ in self._peers}
        for address in wanted:
            if address not in known:
                self._start_lookupd_peer(address)
        self._lookupd_addresses = wanted
        self._lookupd_identified()

    def _config_value(self, name: str) -> tuple[bool, Any]:
        """``GET /config/<name>``: nsqd's option value by its config name, as nsqd gives it
        (durations in nanoseconds, tls_required as nsqd's 0/1/2)."""
        options = self.core.options
        if name == "nsqlookupd_tcp_addresses":
            return True, list(self._lookupd_addresses)
        if name == "log_level":
            return True, self._log_level
        addresses = {
            "tcp_address": self.tcp_address,
            "http_address": self.http_address,
            "https_address": self.https_address or "",
            "broadcast_address": options.broadcast_address,
            "data_path": str(self._data_path or ""),
            "auth_http_addresses": list(self._auth_addresses),
            "tls_required": (2 if self._http_tls_required else 1) if self._tls_required else 0,
        }
        if name in addresses:
            return True, addresses[name]
        if name in CONFIG_OPTION_NAMES:
            value = getattr(options, name)
            if name in CONFIG_DURATIONS and isinstance(value, (int, float)):
                return True, round(value * 1_000_000_000)
            if isinstance(value, tuple):  # the percentiles, as Go writes floats: [1,0.99]
                return True, [go_number(item) for item in value]
            return True, value
        return False, None

    def _route_config(self, request: HTTPRequest) -> HTTPResponse:
        """nsqd's ``/config/<option>``: GET any option; PUT ``nsqlookupd_tcp_addresses`` (a
        JSON list) or ``log_level`` (debug, info, warn, error, fatal)."""
        name = request.path[len("/config/") :]
        if request.method == "PUT":
            body = request.body
            if not body or request.body_too_large or len(body) > self.core.options.max_msg_size:
                return error_response(413, "INVALID_VALUE")
            if name == "nsqlookupd_tcp_addresses":
                try:
                    addresses = json.loads(body)
                except ValueError:
                    return error_response(400, "INVALID_VALUE")
                if not isinstance(addresses, list) or not all(
                    isinstance(a, str) for a in addresses
                ):
                    return error_response(400, "INVALID_VALUE")
                self.set_lookupd_addresses(addresses)
            elif name == "log_level":
                level = LOG_LEVELS.get(body.decode("utf-8", "replace").strip().lower())
                if level is None:
                    return error_response(400, "INVALID_VALUE")
                self._log_level = level
                _log.setLevel(PYTHON_LOG_LEVELS[level])
            else:
                return error_response(400, "INVALID_OPTION")
        found, value = self._config_value(name)
        if not found:
            return error_response(400, "INVALID_OPTION")
        if isinstance(value, str):
            return text_response(value)
        return json_response(value)

    def _backend_factory(self) -> BackendFactory | None:
        if self._data_path is None:
            return None
        self._data_path.mkdir(mode=0o700, parents=True, exist_ok=True)  # as file_backend
        return FileBackendFactory(self._data_path)

    def _load_metadata(self, now: float) -> None:
        if self._data_path is None:
            return
        metadata = load_metadata(self._data_path)
        if metadata is None:
            return
        self.core.load_metadata(metadata, now)
        self.core.take_registry_events()  # announced by the resync when lookupd connects

    def _save_metadata(self) -> None:
        if self._data_path is None or self._core is None:
            return
        with contextlib.suppress(OSError):  # the next change or shutdown writes it again
            save_metadata(self._data_path, self._core.metadata())

    async def aclose(self) -> None:
        """Stop listening, close every client, flush queues to the backends."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            for listener in (self._tcp_listener, self._http_listener, self._https_listener):
                if listener is not None:
                    with contextlib.suppress(Exception):
                        await listener.aclose()
            if self._core is not None:
                self._core.close(anyio.current_time())
                self._save_metadata()
            for peer, _ in self._peers:
                peer.close()

    async def __aenter__(self) -> EmbeddedNSQD:
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
        tg, self._task_group = self._task_group, None
        if tg is None:
            raise RuntimeError("EmbeddedNSQD.__aexit__ without __aenter__")
        tg.cancel_scope.cancel()
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        finally:
            await self.aclose()

    # -- driving the core -----------------------------------------------------------------------

    def _after(self, events: list[ServerEvent]) -> None:
        """Wake whatever the last core call gave work to."""
        core = self.core
        if self._input_waiters:
            for conn_id, waiter in list(self._input_waiters.items()):
                if not core.input_pending(conn_id):
                    del self._input_waiters[conn_id]
                    waiter.input_done.set()
        for conn_id in core.connections_with_output():
            client = self._clients.get(conn_id)
            if client is not None:
                client.wake.set()
        for event in events:
            if isinstance(event, CloseConnection):
                client = self._clients.get(event.conn_id)
                if client is not None:
                    client.closing = True
                    client.wake.set()
            elif isinstance(event, AuthRequested) and self._serve_group is not None:
                self._serve_group.start_soon(self._authenticate, event)
            elif isinstance(event, LookupChannels) and self._serve_group is not None:
                done = self._lookups_done.setdefault(event.lookup_id, anyio.Event())
                self._serve_group.start_soon(self._lookup_channels, event, done)
        registry = core.take_registry_events()
        if registry:
            now = anyio.current_time()
            for peer, wake in self._peers:
                for reg in registry:
                    if isinstance(reg, TopicCreated):
                        peer.register(now, reg.topic)
                    elif isinstance(reg, ChannelCreated):
                        peer.register(now, reg.topic, reg.channel)
                    elif isinstance(reg, TopicDeleted):
                        peer.unregister(now, reg.topic)
                    elif isinstance(reg, ChannelDeleted):
                        peer.unregister(now, reg.topic, reg.channel)
                wake[0].set()
            self._save_metadata()
        deadline = core.next_deadline()
        if deadline is not None and deadline < self._timer_target and self._timer_wake is not None:
            self._timer_wake.set()

    async def _authenticate(self, event: AuthRequested) -> None:
        """Ask the auth server(s) about one AUTH (or a TTL re-check), then tell the core.
        It runs in the server's task group: whatever goes wrong costs this client an
        ``E_AUTH_FAILED``, never the server."""
        state: AuthState | None
        try:
            state = await query_auth(self._auth_urls, event.request, timeout=self._auth_timeout)
        except Exception as exc:  # (its text might hold the secret: the type only)
            _log.error(
                "nsqd: asking the auth server failed: %s",
                type(exc).__name__,
                extra=fields(conn_id=event.conn_id, error=type(exc).__name__),
            )
            state = None
        core = self._core
        if core is None or self._closed:
            return
        try:
            events = core.auth_result(event.conn_id, state, anyio.current_time())
        except LocalProtocolError:  # the connection moved on (closed) while we asked
            return
        except Exception as exc:
            _log.error(
                "nsqd: applying the auth server's answer failed: %s",
                type(exc).__name__,
                extra=fields(conn_id=event.conn_id, error=type(exc).__name__),
            )
            with contextlib.suppress(Exception):
                self._after(core.auth_result(event.conn_id, None, anyio.current_time()))
            return
        self._after(events)

    async def _lookup_channels(self, event: LookupChannels, done: anyio.Event) -> None:
        """Ask every nsqlookupd of a :class:`LookupChannels` at once, each answer to the core
        as it comes (the core ends the lookup when all answered, or at its timeout)."""
        try:
            async with anyio.create_task_group() as tg:
                for address in event.addresses:
                    tg.start_soon(self._ask_lookupd, event, address)
        finally:
            self._lookups_done.pop(event.lookup_id, None)
            done.set()

    async def _ask_lookupd(self, event: LookupChannels, address: str) -> None:
        core = self.core
        channels: list[str] | None = None
        try:
            channels = await query_lookupd_channels(
                address,
                event.topic,
                connect_timeout=core.options.http_client_connect_timeout,
                timeout=core.options.http_client_request_timeout,
            )
        except Exception as exc:  # whatever failed, the topic goes on without its answer
            _log.warning(
                "nsqd: failed to query nsqlookupd %s for channels to pre-create for topic %s - %s",
                address,
                event.topic,
                str(exc) or type(exc).__name__,
                extra=fields(lookupd=address, topic=event.topic, error=exc),
            )
        if self._core is None or self._closed:
            return
        try:
            self._after(core.lookupd_channels(event.lookup_id, address, channels, self.now()))
        except Exception:
            _log.exception(
                "nsqd: applying nsqlookupd's channels failed",
                extra=fields(lookupd=address, topic=event.topic),
            )

    async def _timer_loop(self) -> None:
        core = self.core
        clock = time.perf_counter
        while True:
            now = anyio.current_time()
            deadline = core.next_deadline()
            if deadline is not None and deadline <= now:
                # Each call does a bounded step (a backlog moves, a client's input is run, in
                # many): steps for up to TIMER_SLICE, then every other client and the HTTP API
                # are served before the next ones.
                sliced = clock() + TIMER_SLICE
                while True:
                    try:
                        self._after(core.handle_timer(now))
                    except Exception:
                        _log.exception("nsqd: timer failed")
                        await anyio.sleep(0.1)  # never spin on a failing timer
                        break
                    deadline = core.next_deadline()
                    if deadline is None or deadline > now or clock() >= sliced:
                        break
                await anyio.lowlevel.checkpoint()
                continue
            self._timer_target = math.inf if deadline is None else deadline
            wake = self._timer_wake
            if wake is None:
                wake = self._timer_wake = anyio.Event()
            with anyio.move_on_after(self._timer_target - now):
                await wake.wait()
            self._timer_wake = anyio.Event()
            self._timer_target = -math.inf  # while awake, nobody needs to wake us

    # -- TCP clients ----------------------------------------------------------------------------

    async def _handle_tcp(self, stream: anyio.abc.SocketStream) -> None:
        core = self.core
        try:
            conn_id = core.connect(anyio.current_time(), remote_address(stream))
        except Exception:  # shutting down
            await aclose_quietly(stream)
            return
        client = _Client(conn_id, stream)
        self._clients[conn_id] = client
        try:
            async with anyio.create_task_group() as tg:
                client.scope = tg.cancel_scope
                tg.start_soon(self._writer, client)
                await self._reader(client)
                # reader is done (EOF or close requested): let the writer flush, bounded
                client.closing = True
                client.wake.set()
                with anyio.move_on_after(5.0):
                    await client.writer_done.wait()
                tg.cancel_scope.cancel()
        except Exception:
            # a bug must cost one connection, never the broker
            _log.exception("nsqd: connection %d failed", conn_id, extra=fields(conn_id=conn_id))
        finally:
            self._clients.pop(conn_id, None)
            self._input_waiters.pop(conn_id, None)
            if self._core is not None and not self._closed:
                try:
                    self._after(core.connection_lost(conn_id, anyio.current_time()))
                except Exception:
                    _log.exception(
                        "nsqd: cleaning up connection %d failed",
                        conn_id,
                        extra=fields(conn_id=conn_id),
                    )
            await aclose_quietly(client.stream)

    async def _reader(self, client: _Client) -> None:
        core = self.core
        conn_id = client.conn_id
        limit = max(core.options.max_output_buffer_size, 64 * 1024) * 4
        while not client.closing:
            if core.output_pending(conn_id) > limit:
                # back-pressure: a client that does not read its answers is not read either
                client.drained = anyio.Event()
                client.wake.set()
                await client.drained.wait()
                continue
            try:
                data = await client.stream.receive(65536)
            except IO_ERRORS:
                data = b""
            events = core.receive_data(conn_id, data, anyio.current_time())
            self._after(events)
            for event in events:
                if isinstance(event, StartTLS):
                    await self._upgrade_tls(client, event.trailing_data)
            if not data or core.connection_state(conn_id) is ClientState.CLOSED:
                return
            if core.input_pending(conn_id):
                # The core runs the rest a step at a time from the timer, other clients
                # between steps; reading more now would only grow this client's backlog.
                client.input_done = anyio.Event()
                self._input_waiters[conn_id] = client
                await client.input_done.wait()

    async def _upgrade_tls(self, client: _Client, trailing: bytes) -> None:
        core = self.core
        if self._ssl_context is None:  # the core only asks when tls_available
            client.closing = True
            return
        async with client.send_lock:
            data = core.data_to_send(client.conn_id)
            try:
                if data:
                    await client.stream.send(data)
                with anyio.fail_after(10.0):
                    client.stream = await start_server_tls(
                        client.stream, trailing, self._ssl_context
                    )
            except (TimeoutError, *IO_ERRORS):
                client.closing = True
                self._after(core.connection_lost(client.conn_id, anyio.current_time()))
                return
        self._after(core.tls_established(client.conn_id, anyio.current_time()))

    async def _writer(self, client: _Client) -> None:
        core = self.core
        conn_id = client.conn_id
        send_timeout = core.options.client_timeout
        try:
            while True:
                await client.wake.wait()
                client.wake = anyio.Event()
                async with client.send_lock:
                    data = core.data_to_send(conn_id, anyio.current_time())
                    if data:
                        with anyio.fail_after(send_timeout):
                            await client.stream.send(data)
                if core.output_pending(conn_id):
                    client.wake.set()  # data_to_send resumed deliveries: write them too
                if not client.drained.is_set():
                    client.drained.set()
                if client.closing and core.output_pending(conn_id) == 0:
                    if client.scope is not None:
                        client.scope.cancel()  # the reader may be blocked in receive
                    return
        except (TimeoutError, *IO_ERRORS):
            client.closing = True
            if client.scope is not None:
                client.scope.cancel()
        finally:
            client.writer_done.set()
            client.drained.set()

    # -- HTTP -----------------------------------------------------------------------------------

    async def _handle_http(self, stream: anyio.abc.SocketStream) -> None:
        core = self.core
        route = self._route_tls_required if self._http_tls_required else self._route
        await serve_http_connection(
            stream, route, max_body=core.options.max_body_size, limits=self._http_limits
        )

    async def _route_tls_required(self, request: HTTPRequest) -> HTTPResponse:
        """nsqd with ``--tls-required``: plain HTTP answers 403 and points at HTTPS (the body
        byte for byte as nsqd writes it)."""
        body = f'{{"message": "TLS_REQUIRED", "https_port": {self._https_port}}}'
        return json_response(body.encode(), 403)

    async def _handle_https(self, stream: anyio.abc.SocketStream) -> None:
        if self._ssl_context is None:
            await aclose_quietly(stream)
            return
        try:
            with anyio.fail_after(10.0):
                tls = await TLSStream.wrap(
                    stream,
                    server_side=True,
                    ssl_context=self._ssl_context,
                    standard_compatible=False,
                )
        except (TimeoutError, *IO_ERRORS):
            await aclose_quietly(stream)
            return
        await serve_http_connection(
            tls, self._route, max_body=self.core.options.max_body_size, limits=self._https_limits
        )

    async def _route(self, request: HTTPRequest) -> HTTPResponse:
        core = self.core
        now = anyio.current_time()
        if request.path.startswith("/config/") and len(request.path) > len("/config/"):
            if request.method in ("GET", "PUT"):
                return self._route_config(request)
            refused = method_not_routed({request.path: CONFIG_METHODS}, request)
            assert refused is not None
            return refused
        try:
            response, events = route_nsqd(core, request, now)
        except AdminError as err:
            self._after([])
            return error_response(err.status, err.code)
        self._after(events)
        for event in events:
            # the request created a topic: nsqd answers once nsqlookupd told its channels
            done = (
                self._lookups_done.get(event.lookup_id)
                if isinstance(event, LookupChannels)
                else None
            )
            if done is not None:
                with anyio.move_on_after(core.options.http_client_request_timeout + 1.0):
                    await done.wait()
        return response


def _check_tls_options(
    cert: str | None,
    key: str | None,
    root_ca_file: str | None,
    client_auth_policy: str | None,
    *,
    tls_required: bool,
    https_address: str | None,
) -> None:
    """nsqd's start-up checks of the TLS options, as a :class:`ConfigError` (its words where
    it has them): without a certificate and key nothing may require or configure TLS."""
    if bool(cert) != bool(key):
        raise ConfigError("tls_cert and tls_key must be given together")
    if cert:
        return
    for name, given in (
        ("tls_client_auth_policy", client_auth_policy is not None),
        ("tls_required", tls_required),
    ):
        if given:
            raise ConfigError(
                f"{name}: cannot require TLS client connections without TLS key and cert "
                "(tls_cert, tls_key)"
            )
    if root_ca_file is not None:
        raise ConfigError(
            "tls_root_ca_file needs tls_cert and tls_key: the embedded nsqd uses it only to "
            "verify client certificates"
        )
    if https_address is not None:
        raise ConfigError("https_address needs tls_cert and tls_key")


def _tls_required_mode(value: bool | str) -> tuple[bool, bool]:
    """nsqd's ``--tls-required`` (true, false, tcp-https) -> (TCP needs TLS, HTTP needs TLS)."""
    if isinstance(value, str):
        mode = value.strip().lower()
        if mode == "tcp-https":
            return True, False
        if mode in ("true", "1", "t", "yes", "on"):
            return True, True
        if mode in ("false", "0", "f", "no", "off", ""):
            return False, False
        raise ConfigError(f"tls_required must be true, false or tcp-https, got {value!r}")
    return bool(value), bool(value)
