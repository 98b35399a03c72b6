"""An embedded nsqd's registration with one nsqlookupd: connect (retrying as the core's
:class:`~nsq_sansio.server.lookupd_client.LookupPeer` says), announce every topic and channel,
then write what the peer queues (REGISTER, UNREGISTER, PING) and read its answers until the
connection or the peer is closed.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.abc

from nsq_sansio.server.lookupd_client import LookupPeer, LookupPeerState, sync_registrations

from ._net import IO_ERRORS, aclose_quietly, parse_address

__all__ = ["serve_lookupd_peer"]


async def serve_lookupd_peer(
    peer: LookupPeer,
    wake: list[anyio.Event],
    registrations: Callable[[], list[tuple[str, list[str]]]],
) -> None:
    """Keep ``peer`` connected until it is closed. ``wake[0]`` is set when the peer has
    something to send (it is replaced after each wait); ``registrations()`` lists the node's
    topics with their channels, announced on every (re)connection."""
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
                tg.start_soon(_read, peer, stream, tg.cancel_scope, wake)
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
) -> None:
    while peer.state is LookupPeerState.CONNECTED:
        try:
            data = await stream.receive(65536)
        except IO_ERRORS:
            data = b""
        peer.receive_data(data, anyio.current_time())
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
