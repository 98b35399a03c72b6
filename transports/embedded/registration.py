"""An embedded nsqd's registration with one nsqlookupd: connect (retrying as the core's
:class:`~nsq_sansio.server.lookupd_client.LookupPeer` says), announce every topic and channel,
then write what the peer queues (REGISTER, UNREGISTER, PING) and read its answers until the
connection or the peer is closed.

And nsqd's one HTTP request to nsqlookupd: :func:`query_lookupd_channels`, the channels of a
topic it creates (``GET /channels?topic=``, h11 over anyio, bounded in time and size).
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.abc
import h11

from nsq_sansio.server.lookupd_client import (
    LookupPeer,
    LookupPeerIdentified,
    LookupPeerState,
    channels_request_target,
    parse_channels_answer,
    sync_registrations,
)

from ._net import IO_ERRORS, aclose_quietly, format_address, parse_address, read_http_answer

__all__ = ["MAX_CHANNELS_ANSWER", "query_lookupd_channels", "serve_lookupd_peer"]

#: The largest answer to ``GET /channels`` read (thousands of channel names fit in far less).
MAX_CHANNELS_ANSWER = 1 << 20


async def serve_lookupd_peer(
    peer: LookupPeer,
    wake: list[anyio.Event],
    registrations: Callable[[], list[tuple[str, list[str]]]],
    identified: Callable[[], None] = lambda: None,
) -> None:
    """Keep ``peer`` connected until it is closed. ``wake[0]`` is set when the peer has
    something to send (it is replaced after each wait); ``registrations()`` lists the node's
    topics with their channels, announced on every (re)connection; ``identified()`` is
    called when nsqlookupd answered IDENTIFY (``peer.info`` then says where its HTTP API
    is)."""
    host, port = parse_address(peer.address, 4160)
    while peer.state is not LookupPeerState.CLOSED:
        now = anyio.current_time()
        if not peer.wants_connect(now):
            deadline = peer.next_deadline()
            with anyio.move_on_after(max(0.0, (deadline or now + 1.0) - now)):
                await wake[0].wait()
            wake[0] = anyio.Event()
            continue
        try:
            with anyio.fail_after(2.0):
                stream = await anyio.connect_tcp(host, port)
        except (TimeoutError, OSError):
            peer.connection_failed(anyio.current_time())
            continue
        peer.connection_made(anyio.current_time(), sync_registrations(registrations()))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_read, peer, stream, tg.cancel_scope, wake, identified)
                await _write(peer, stream, wake)
                tg.cancel_scope.cancel()
        finally:
            if peer.state is LookupPeerState.CONNECTED:
                peer.connection_lost(anyio.current_time())
            await aclose_quietly(stream)


async def _read(
    peer: LookupPeer,
    stream: anyio.abc.SocketStream,
    scope: anyio.CancelScope,
    wake: list[anyio.Event],
    identified: Callable[[], None],
) -> None:
    while peer.state is LookupPeerState.CONNECTED:
        try:
            data = await stream.receive(65536)
        except IO_ERRORS:
            data = b""
        events = peer.receive_data(data, anyio.current_time())
        if any(isinstance(event, LookupPeerIdentified) for event in events):
            identified()
        wake[0].set()
    scope.cancel()


async def _write(peer: LookupPeer, stream: anyio.abc.SocketStream, wake: list[anyio.Event]) -> None:
    while peer.state is LookupPeerState.CONNECTED:
        data = peer.data_to_send()
        if data:
            try:
                await stream.send(data)
            except IO_ERRORS:
                peer.connection_lost(anyio.current_time())
                return
        now = anyio.current_time()
        deadline = peer.next_deadline()
        if deadline is not None and deadline <= now:
            peer.handle_timer(now)
            continue
        with anyio.move_on_after((deadline or now + 1.0) - now):
            await wake[0].wait()
        wake[0] = anyio.Event()


async def query_lookupd_channels(
    address: str, topic: str, *, connect_timeout: float, timeout: float
) -> list[str]:
    """Ask one nsqlookupd (its HTTP ``host:port``) for the channels of ``topic``, as nsqd
    does when it creates a topic: ``timeout`` bounds the whole request (``connect_timeout``
    the connection), as nsqd's HTTP client. Raises on any failure (``TimeoutError``,
    ``OSError``, an answer that is not a ``200`` with a channel list...)."""
    host, port = parse_address(address, 4161)
    with anyio.fail_after(timeout):
        with anyio.fail_after(connect_timeout):
            stream = await anyio.connect_tcp(host, port)
        async with stream:
            conn = h11.Connection(h11.CLIENT)
            headers = [
                ("Host", format_address(host, port)),
                ("Accept", "application/vnd.nsq; version=1.0"),
                ("User-Agent", "nsq-sansio-embedded-nsqd"),
                ("Connection", "close"),
            ]
            request = h11.Request(
                method="GET", target=channels_request_target(topic), headers=headers
            )
            await stream.send((conn.send(request) or b"") + (conn.send(h11.EndOfMessage()) or b""))
            status, body = await read_http_answer(
                stream, conn, limit=MAX_CHANNELS_ANSWER, error=ValueError
            )
    if status != 200:
        raise ValueError(f"answered HTTP {status}")
    return parse_channels_answer(body)
