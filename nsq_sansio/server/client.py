"""The node's record of one client connection (nsqd's ``client_v2.go``).

A :class:`Client` holds what nsqd knows of a connection: the settings IDENTIFY negotiated
(heartbeats, output buffering, sample rate, message timeout, TLS and compression), its AUTH
state, the channel it subscribed to with its RDY and in-flight count, the input not yet parsed
and the output not yet taken by the transport, and its counters for ``/stats``
(:func:`client_stats`). It is a plain record: the protocol (:mod:`.protocol_v2`) and the channel
(:mod:`.channel`) act on it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from .channel import Channel
from .context import INF
from .options import AuthState, NSQDOptions
from .states import STATS_STATE, ClientState

__all__ = ["DEFAULT_OUTPUT_BUFFER_SIZE", "Client", "client_stats", "high_water"]

DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024
# The least unsent output at which deliveries to a client pause (its output_buffer_size when
# larger): nsqd's messagePump blocks in its write once bufio (16 KiB) and the kernel's socket
# buffer are full; below this much the transport would write in chunks too small to be fast.
_MIN_HIGH_WATER = 64 * 1024


def high_water(output_buffer_size: int) -> int:
    """The unsent output at which deliveries to a client pause."""
    return max(output_buffer_size, _MIN_HIGH_WATER)


class Client:
    """The node's record of one client connection."""

    __slots__ = (
        "alarm_at",
        "auth",
        "auth_expires",
        "auth_refreshing",
        "auth_secret",
        "blocked",
        "channel",
        "client_id",
        "compressed",
        "compressed_len",
        "connected_at",
        "decoder",
        "deflate",
        "deflate_level",
        "encoder",
        "finish_count",
        "heartbeat_interval",
        "held_out",
        "high_water",
        "hostname",
        "id",
        "in_flight",
        "inbuf",
        "last_read",
        "lookup_id",
        "message_count",
        "more_input",
        "msg_timeout",
        "next_heartbeat",
        "out",
        "out_len",
        "output_buffer_size",
        "output_buffer_timeout",
        "pending_compression",
        "pending_params",
        "pending_size",
        "pending_verb",
        "pieces",
        "poll_delay",
        "pub_counts",
        "queued",
        "raw_prefix",
        "ready_count",
        "remote_address",
        "requeue_count",
        "sample_rate",
        "snappy",
        "state",
        "switch_input",
        "tls",
        "took",
        "user_agent",
    )

    def __init__(self, conn_id: int, remote_address: str, now: float, options: NSQDOptions) -> None:
        self.id = conn_id
        self.remote_address = remote_address
        host = remote_address.rsplit(":", 1)[0] if ":" in remote_address else remote_address
        self.client_id = host
        self.hostname = host
        self.user_agent = ""
        self.state = ClientState.AWAITING_MAGIC
        self.connected_at = now
        self.last_read = now
        self.heartbeat_interval = options.client_timeout / 2
        self.next_heartbeat = now + self.heartbeat_interval
        self.msg_timeout = options.msg_timeout
        self.sample_rate = 0
        self.output_buffer_size = DEFAULT_OUTPUT_BUFFER_SIZE
        # Deliveries stop while this many bytes wait unsent (see NSQD.data_to_send).
        self.high_water = high_water(DEFAULT_OUTPUT_BUFFER_SIZE)
        # True when deliveries stopped at high_water with RDY left: data_to_send resumes them.
        self.blocked = False
        self.took = False  # data_to_send took output since the last back-pressure poll
        self.poll_delay = 0.0  # > 0 while back-pressure polls run (see ProtocolV2.client_timer)
        self.output_buffer_timeout = options.output_buffer_timeout
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        self.encoder: Any = None
        self.decoder: Any = None
        self.pending_compression: tuple[str, int] | None = None
        self.switch_input = False
        self.auth: AuthState | None = None
        self.auth_secret = ""
        self.auth_expires = 0.0
        self.auth_refreshing = False
        self.channel: Channel[Client] | None = None
        self.ready_count = 0
        self.in_flight = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.queued = False
        self.inbuf = bytearray()
        # Compressed input not decompressed yet: whole chunks as read, and the one being
        # decompressed (its pieces come out a bounded step at a time).
        self.compressed: deque[bytes] = deque()
        self.compressed_len = 0
        self.pieces: Iterator[bytes] | None = None
        # The node holds input it has not processed yet (a step per handle_timer call).
        self.more_input = False
        self.out: list[bytes] = []
        self.out_len = 0
        self.raw_prefix = b""
        # Waiting for nsqlookupd (the id of the ChannelLookup its command started, else 0):
        # its input waits, and so does the answer to that command (held_out), as in nsqd.
        self.lookup_id = 0
        self.held_out: list[bytes] = []
        self.pending_verb: bytes | None = None
        self.pending_params: list[bytes] = []
        self.pending_size = -1
        self.alarm_at = INF


def client_stats(conn: Client, epoch_offset: float, topic: str | None = None) -> dict[str, Any]:
    """One client's entry of /stats; a producer's ``pub_counts`` only for ``topic`` when
    one is given (and left out when that leaves none, as nsqd's omitempty does)."""
    stats: dict[str, Any] = {
        "client_id": conn.client_id,
        "hostname": conn.hostname,
        "version": "V2",
        "remote_address": conn.remote_address,
        "state": STATS_STATE[conn.state],
        "ready_count": conn.ready_count,
        "in_flight_count": conn.in_flight,
        "message_count": conn.message_count,
        "finish_count": conn.finish_count,
        "requeue_count": conn.requeue_count,
        "connect_ts": int(conn.connected_at + epoch_offset),
        "sample_rate": conn.sample_rate,
        "deflate": conn.deflate,
        "snappy": conn.snappy,
        "user_agent": conn.user_agent,
        "tls": conn.tls,
        "tls_cipher_suite": "",
        "tls_version": "",
        "tls_negotiated_protocol": "",
        "tls_negotiated_protocol_is_mutual": False,
    }
    if conn.auth is not None and conn.auth.authorizations:
        stats["authed"] = True
        stats["auth_identity"] = conn.auth.identity
        stats["auth_identity_url"] = conn.auth.identity_url
    counts = conn.pub_counts
    if topic is not None:
        counts = {topic: counts[topic]} if topic in counts else {}
    if counts:
        stats["pub_counts"] = [
            {"topic": name, "count": count} for name, count in sorted(counts.items())
        ]
    return stats
