"""One connection to nsqd, client role: protocol V2 as a state machine with no IO.

Feed what the socket reads to :meth:`ClientConnection.receive_data` (``b""`` at EOF) and act on
the events it returns; write what :meth:`ClientConnection.data_to_send` returns. Commands
(``subscribe``, ``send_ready``, ``finish``, ``publish``...) only queue bytes.

Lifecycle (every move is in one table, see :class:`ConnectionState`)::

    IDENTIFYING -> [TLS_HANDSHAKE -> AWAITING_TLS_OK] -> [AWAITING_COMPRESSION_OK]
        -> [AUTHENTICATING] -> READY -> SUBSCRIBING -> SUBSCRIBED -> CLOSING -> CLOSED

Upgrades happen at exactly the byte nsqd switches: bytes after the IDENTIFY answer belong to the
TLS layer (handed back in :class:`~nsq_sansio.events.TLSUpgradeRequired`) or are compressed.

The connection holds nsqd to the RDY it was given (see :meth:`ClientConnection.send_ready`):
a peer that pushes more messages than that is refused with
:class:`~nsq_sansio.errors.ReadyCountExceeded`, and the messages beyond the bound are not
delivered, so what one read can produce stays bounded even when it is compressed.

The connection is one object made of parts that each do one job in their own module, with
their rules at its top: the handshake (``_negotiation``: IDENTIFY, TLS, compression, AUTH), the
frame loop (``_frame_loop``: bytes in, events out, answers matched to commands), the subscriber
(``_subscribing``: SUB, RDY and its bound, FIN, REQ, TOUCH), publishing (``_publishing``: PUB,
MPUB, DPUB, coalescing), and the lifecycle's table (``_connection_lifecycle``). This module
holds construction, bytes in and out, the timer, closing and failing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from . import frames
from ._connection_lifecycle import INITIAL_STATE, Awaiting, ConnectionState, Lifecycle, next_state
from ._frame_loop import FrameLoop
from ._negotiation import MAX_ANSWER_SIZE, Negotiation, identify_fields
from ._publishing import (
    COALESCE_BYTES,
    DEFAULT_MAX_REQ_TIMEOUT,
    MAX_COMMAND_DELAY,
    Publishing,
    check_deferred_delay,
    delay_error,
    milliseconds,
)
from ._subscribing import Subscribing
from .compression import Codec
from .errors import ConnectionLost, LocalProtocolError, NSQError
from .events import AuthResult, ConnectionClosed, Event, ServerSettings

if TYPE_CHECKING:
    from .config import Config

__all__ = [
    "COALESCE_BYTES",
    "DEFAULT_MAX_REQ_TIMEOUT",
    "MAX_ANSWER_SIZE",
    "MAX_COMMAND_DELAY",
    "ClientConnection",
    "ConnectionState",
    "check_deferred_delay",
]

_S = ConnectionState
#: nsqd's default message timeout (ms), until its IDENTIFY answer says otherwise.
_DEFAULT_MSG_TIMEOUT_MS = 60_000


class ClientConnection(FrameLoop, Negotiation, Subscribing, Publishing):
    """Client side of one nsqd connection. Construction queues the magic and IDENTIFY.

    ``identify`` holds IDENTIFY's JSON fields (``client_id``, ``hostname``, ``user_agent``,
    ``heartbeat_interval`` in ms, ``tls_v1``, ``snappy``, ``deflate``, ``deflate_level``,
    ``sample_rate``, ``msg_timeout``, ``output_buffer_*``); ``feature_negotiation`` is always on.
    A feature asked for is required: ``tls_v1``, ``snappy`` or ``deflate`` that nsqd does not
    enable fails the connection with an :class:`~nsq_sansio.errors.IncompatibleNSQD`.

    ``auth_secret`` is sent with AUTH when nsqd requires it; ``auth_requires_tls`` refuses to
    send it over a connection that is not TLS. ``max_req_timeout`` is nsqd's
    ``--max-req-timeout`` in seconds when the caller knows it (nsqd does not announce it), for
    the local checks of REQ and DPUB delays. ``peer`` names the server in error messages
    (``"127.0.0.1:4150"``); leave it None when the caller's logs already say which it is.
    """

    __slots__ = (  # noqa: RUF023 (grouped by the part each field belongs to)
        # The connection's own: its state, what it writes and awaits, its limits and clock.
        "_state",
        "_out",
        "_awaiting",
        "_max_frame_size",
        "_max_req_timeout",
        "_last_received",
        "heartbeat_interval",
        # The handshake's (Negotiation).
        "_requested",
        "_auth_secret",
        "_auth_requires_tls",
        "_peer",
        "_switch",
        "_codec",
        "_out_plain",
        "settings",
        "auth",
        # The frame loop's (FrameLoop).
        "_pending",
        "_pending_need",
        "_frame_limit",
        "_accepts_messages",
        "_as",
        "_unsolicited",
        "_close_wait_received",
        # The subscriber's (Subscribing): messages in flight, RDY and its bound.
        "topic",
        "channel",
        "_in_flight",
        "_rdy",
        "_rdy_remaining",
        "_ceiling",
        "_credit",
        "_allowed",
        "_expiry_window",
        "_held_history",
        # Publishing's (Publishing).
        "_next_request_id",
        "_pub_headers",
        "_tail_pub",
        "_group",
        "_group_bytes",
        "_group_sizes",
    )

    def __init__(
        self,
        identify: Mapping[str, object] | None = None,
        *,
        auth_secret: bytes | str | None = None,
        max_frame_size: int = frames.DEFAULT_MAX_FRAME_SIZE,
        auth_requires_tls: bool = False,
        max_req_timeout: float | None = None,
        peer: str | None = None,
    ) -> None:
        fields, heartbeat_interval = identify_fields(identify)
        #: Seconds between nsqd's heartbeats, or None when they were disabled (-1).
        self.heartbeat_interval: float | None = heartbeat_interval
        if max_req_timeout is not None:
            milliseconds("max_req_timeout", max_req_timeout)  # a number of seconds, in range
        self._max_req_timeout = max_req_timeout
        self._max_frame_size = max_frame_size
        frames.FrameDecoder(max_frame_size)  # validates the limit with the same rule
        self._state = INITIAL_STATE
        self._out: list[bytes] = [frames.MAGIC_V2, frames.encode_identify(fields)]
        self._awaiting: deque[tuple[Awaiting, int]] = deque([(Awaiting.IDENTIFY, 0)])
        self._last_received: float | None = None
        # The handshake.
        self._requested = fields
        if isinstance(auth_secret, str):
            auth_secret = auth_secret.encode()
        self._auth_secret = auth_secret
        self._auth_requires_tls = bool(auth_requires_tls)
        self._peer = peer
        self._switch = False
        self._codec: Codec | None = None
        self._out_plain = b""
        self.settings: ServerSettings | None = None
        self.auth: AuthResult | None = None
        # The frame loop: frames are answers to the handshake until READY, none larger.
        self._pending = bytearray()
        self._pending_need = 8
        self._frame_limit = min(max_frame_size, MAX_ANSWER_SIZE + 4)
        self._accepts_messages = False
        self._as = None
        self._unsolicited = 0
        self._close_wait_received = False
        # The subscriber: nothing in flight, no RDY yet.
        self.topic: str | None = None
        self.channel: str | None = None
        self._in_flight: set[bytes] = set()
        self._rdy = 0
        self._rdy_remaining = 0
        self._ceiling = 0
        self._credit = 0
        self._allowed = 0
        self._expiry_window = _DEFAULT_MSG_TIMEOUT_MS / 2000
        self._held_history = deque()
        # Publishing.
        self._next_request_id = 1
        self._pub_headers = {}
        self._tail_pub = None
        self._group = None
        self._group_bytes = 0
        self._group_sizes = {}

    @classmethod
    def from_config(
        cls, config: Config, *, peer: str | None = None, **overrides: Any
    ) -> ClientConnection:
        """A connection for ``config``: its IDENTIFY fields, ``auth_secret``,
        ``auth_requires_tls`` and ``max_req_timeout`` (``overrides`` are other keyword
        arguments of the constructor, such as ``max_frame_size``)."""
        return cls(
            config.identify_body(),
            auth_secret=config.auth_secret,
            auth_requires_tls=config.auth_requires_tls,
            max_req_timeout=config.max_req_timeout,
            peer=peer,
            **overrides,
        )

    # --- introspection ----------------------------------------------------------------------

    @property
    def state(self) -> ConnectionState:
        """Where the connection is in its lifecycle (handshake, ready, subscribed, closing...)."""
        return self._state

    @property
    def max_req_timeout(self) -> float | None:
        """nsqd's ``--max-req-timeout`` in seconds: as given, or as nsqd announced it; None
        when unknown (REQ delays are then only checked against what the wire can carry, and
        DPUB delays against nsqd's default, :data:`DEFAULT_MAX_REQ_TIMEOUT`)."""
        return self._max_req_timeout

    @property
    def max_rdy_count(self) -> int:
        """nsqd's ``max_rdy_count`` from the IDENTIFY answer (its default before the answer)."""
        settings = self.settings or ServerSettings.default()
        return settings.max_rdy_count

    @property
    def last_received(self) -> float | None:
        """When bytes were last received (the ``now`` given to :meth:`receive_data`)."""
        return self._last_received

    # --- bytes in, bytes out -----------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Everything queued since the last call, compressed when compression is on."""
        if self._tail_pub is not None:
            self._close_group()
        plain = self._out_plain
        if not self._out:
            if plain:
                self._out_plain = b""
            return plain
        data = b"".join(self._out)
        self._out.clear()
        if self._codec is not None:
            data = self._codec.compress(data)
        if plain:
            self._out_plain = b""
            return plain + data
        return data

    def receive_data(self, data: bytes, now: float | None = None) -> list[Event]:
        """Feed bytes read from the socket (``b""`` at EOF); return the events they complete.

        Never raises on what the peer sent: a broken stream ends with a
        :class:`ConnectionClosed` event whose ``error`` says what was wrong.
        """
        if now is not None:
            self._last_received = now
        events: list[Event] = []
        if self._state is _S.CLOSED:
            return events
        if not data:
            self._on_eof(events)
            return events
        if self._state is _S.TLS_HANDSHAKE:
            raise LocalProtocolError(
                "receive_data() in state TLS_HANDSHAKE: feed these bytes to the TLS layer and "
                "call tls_established() when the handshake is done"
            )
        if type(data) is not bytes:
            data = bytes(data)  # ids and bodies must not be views of the caller's buffer
        self._unsolicited = 0
        if self._codec is None:
            self._process(data, events)
        else:
            self._decompress_and_process(data, events)
        return events

    def _receive_as(
        self,
        handle_type: type,
        conn_id: int,
        address: object,
        data: bytes,
        now: float,
        msg_timeout: float,
    ) -> list[Any]:
        """:meth:`receive_data` for the consumer coordinator: each message frame comes as
        ``handle_type((conn_id, id, body, timestamp, attempts, address, now, now +
        msg_timeout))`` (its ``Deliver``) instead of a :class:`Message`, built by the decoder
        itself (one object per message, not two)."""
        self._as = (handle_type, conn_id, address, now, now + msg_timeout)
        try:
            return self.receive_data(data, now)
        finally:
            self._as = None

    def handle_timer(self, now: float) -> list[Event]:
        """Close a connection that has been silent for two heartbeat intervals and more."""
        events: list[Event] = []
        deadline = self.next_deadline()
        if deadline is not None and now >= deadline:
            self._fail(
                ConnectionLost(
                    f"nothing received from nsqd for {now - (self._last_received or now):.1f}s "
                    f"(heartbeats every {self.heartbeat_interval}s) in state {self._state.name}"
                ),
                events,
            )
        return events

    def next_deadline(self) -> float | None:
        """When to call :meth:`handle_timer`: 2.5 heartbeat intervals after the last data."""
        if self.heartbeat_interval is None or self._last_received is None:
            return None
        if self._state is _S.CLOSED:
            return None
        return self._last_received + 2.5 * self.heartbeat_interval

    def tls_established(self) -> None:
        """The transport finished the TLS handshake; what is read next is plaintext from TLS."""
        self._require("tls_established()", (_S.TLS_HANDSHAKE,))
        self._enter(Lifecycle.TLS_ESTABLISHED)

    # --- commands ------------------------------------------------------------------------------

    def nop(self) -> None:
        """``NOP``."""
        self._require("nop()", tuple(s for s in _S if s is not _S.CLOSED))
        self._out.append(b"NOP\n")

    def close(self) -> ConnectionClosed | None:
        """Close: ``CLS`` when subscribed (nsqd answers ``CLOSE_WAIT``), at once otherwise.

        Returns ``None`` when CLS was queued: in-flight messages can still be answered and the
        close is reported by :meth:`receive_data`. Otherwise the connection is closed now and the
        returned event lists what was abandoned (unanswered publishes, in-flight messages), so
        the transport can fail them instead of waiting forever.
        """
        if self._state is _S.CLOSING or self._state is _S.CLOSED:
            return None
        if self._state is _S.SUBSCRIBED:
            self._out.append(b"CLS\n")
            self._awaiting.append((Awaiting.CLS, 0))
            self._enter(Lifecycle.CLS_SENT)
            return None
        abandoned = self.pending_requests
        error = (
            None
            if not abandoned and not self._in_flight
            else ConnectionLost(f"closed by the client in state {self._state.name}")
        )
        events: list[Event] = []
        self._fail(error, events)
        closed = events[0]
        assert isinstance(closed, ConnectionClosed)
        return closed

    # --- internals -----------------------------------------------------------------------------

    #: The error of a delay above nsqd's ``--max-req-timeout`` (the consumer raises it too).
    _delay_error = staticmethod(delay_error)

    def _require(self, what: str, states: Iterable[ConnectionState]) -> None:
        if self._state not in states:
            allowed = ", ".join(s.name for s in states)
            raise LocalProtocolError(
                f"{what} is not allowed in state {self._state.name} (only in {allowed})"
            )

    def _enter(self, event: Lifecycle) -> None:
        """Move to the state ``event`` leads to from this one: every state change goes
        through the lifecycle's table, and a move not in it raises
        :class:`~nsq_sansio.errors.LocalProtocolError`."""
        self._state = next_state(self._state, event)

    def _on_eof(self, events: list[Event]) -> None:
        if self._state is _S.CLOSING and self._close_wait_received and not self._pending:
            self._fail(None, events)
        else:
            where = (
                f" with {len(self._pending)} bytes of an unfinished frame" if self._pending else ""
            )
            self._fail(
                ConnectionLost(f"nsqd closed the connection in state {self._state.name}{where}"),
                events,
            )

    def _fail(self, error: NSQError | None, events: list[Event]) -> None:
        """Enter CLOSED and report what was left unanswered."""
        self._enter(Lifecycle.CLOSED)
        self._accepts_messages = False
        self._switch = False
        events.append(ConnectionClosed(error, tuple(self._in_flight), self.pending_requests))
        self._in_flight.clear()
        self._awaiting.clear()
        self._tail_pub = None
        self._group = None
        self._group_sizes.clear()
        self._out.clear()
        self._out_plain = b""
        self._rdy = self._rdy_remaining = 0
