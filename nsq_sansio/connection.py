"""One connection to nsqd, client role: protocol V2 as a state machine with no IO.

Feed what the socket reads to :meth:`ClientConnection.receive_data` (``b""`` at EOF) and act on
the events it returns; write what :meth:`ClientConnection.data_to_send` returns. Commands
(``subscribe``, ``send_ready``, ``finish``, ``publish``...) only queue bytes.

Lifecycle::

    IDENTIFYING -> [TLS_HANDSHAKE -> AWAITING_TLS_OK] -> [AWAITING_COMPRESSION_OK]
        -> [AUTHENTICATING] -> READY -> SUBSCRIBING -> SUBSCRIBED -> CLOSING -> CLOSED

Upgrades happen at exactly the byte nsqd switches: bytes after the IDENTIFY answer belong to the
TLS layer (handed back in :class:`~nsq_sansio.events.TLSUpgradeRequired`) or are compressed.

The connection holds nsqd to the RDY it was given (see :meth:`ClientConnection.send_ready`):
a peer that pushes more messages than that is refused with
:class:`~nsq_sansio.errors.ReadyCountExceeded`, and the messages beyond the bound are not
delivered, so what one read can produce stays bounded even when it is compressed.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

from . import frames
from .compression import Codec, DeflateCodec, SnappyCodec
from .errors import (
    AuthSecretMissing,
    CoalescedPublishRefused,
    CompressionError,
    CompressionUnavailable,
    ConnectionLost,
    DelayOutOfRange,
    FrameTooLarge,
    IdentifyRejected,
    InsecureAuthRefused,
    LocalProtocolError,
    NSQError,
    ReadyCountExceeded,
    RemoteProtocolError,
    ServerError,
    TLSUnavailable,
    WrongPort,
)
from .events import (
    AuthResult,
    CloseWait,
    ConnectionClosed,
    ConnectionReady,
    Event,
    Heartbeat,
    Message,
    MessageTakenBack,
    PublishAcknowledged,
    PublishFailed,
    ServerSettings,
    Subscribed,
    TLSUpgradeRequired,
)

if TYPE_CHECKING:
    from .config import Config

__all__ = [
    "DEFAULT_MAX_REQ_TIMEOUT",
    "MAX_ANSWER_SIZE",
    "MAX_COMMAND_DELAY",
    "ClientConnection",
    "ConnectionState",
    "check_deferred_delay",
]


class ConnectionState(Enum):
    """Where a client connection is in its lifecycle."""

    IDENTIFYING = "IDENTIFYING"
    TLS_HANDSHAKE = "TLS_HANDSHAKE"
    AWAITING_TLS_OK = "AWAITING_TLS_OK"
    AWAITING_COMPRESSION_OK = "AWAITING_COMPRESSION_OK"
    AUTHENTICATING = "AUTHENTICATING"
    READY = "READY"
    SUBSCRIBING = "SUBSCRIBING"
    SUBSCRIBED = "SUBSCRIBED"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"


class _Awaiting(Enum):
    """What a pending response answers (responses come back in command order)."""

    IDENTIFY = 0
    TLS_OK = 1
    COMPRESSION_OK = 2
    AUTH = 3
    SUB = 4
    PUBLISH = 5
    CLS = 6
    PUBLISH_GROUP = 7  # PUBs coalesced into one MPUB: one answer for consecutive request ids


_S = ConnectionState
_HEADER = struct.Struct(">II")
_SIZE = struct.Struct(">I")
_MESSAGE_HEADER = struct.Struct(">qH")
#: A frame header and a message header (timestamp, attempts) in one unpack.
_FRAME_AND_MESSAGE_HEADER = struct.Struct(">IIqH16s")
_new_tuple = tuple.__new__
_PUBLISH_STATES = frozenset({_S.READY, _S.SUBSCRIBING, _S.SUBSCRIBED})
_MESSAGE_STATES = frozenset({_S.SUBSCRIBED, _S.CLOSING})
#: Topics whose PUB header a connection keeps (a producer usually has a handful).
_PUB_HEADERS_KEPT = 256
_MAX_BODY = 0x7FFFFFFF  # what a frame's size field can say (frames checks the same)
_PUBLISH_AWAITING = _Awaiting.PUBLISH
_GROUP_AWAITING = _Awaiting.PUBLISH_GROUP
#: PUBs coalesced into one MPUB carry at most this many bytes of bodies together (far below
#: nsqd's default ``--max-body-size`` of 5 MiB, and a write's worth on a busy connection).
COALESCE_BYTES = 256 * 1024
_NON_FATAL_COMMANDS = {"E_FIN_FAILED": "FIN", "E_REQ_FAILED": "REQ", "E_TOUCH_FAILED": "TOUCH"}
#: Heartbeats nsqd sends when IDENTIFY does not set an interval (ms).
_DEFAULT_HEARTBEAT_MS = 30_000
#: nsqd's default message timeout (ms), until its IDENTIFY answer says otherwise.
_DEFAULT_MSG_TIMEOUT_MS = 60_000
#: Heartbeats and late-answer errors one read may bring, beyond one error per message that
#: may be held (twice nsqd's max_rdy_count).
_UNSOLICITED_PER_READ = 64
#: The largest IDENTIFY or AUTH answer read (bytes): nsqd's are a few hundred bytes of JSON, so
#: anything near this is not nsqd, and is refused before it is buffered or parsed.
MAX_ANSWER_SIZE = 64 * 1024
#: nsqd's default ``--max-req-timeout`` (seconds), assumed for DPUB when nsqd's own is not known
#: (nsqd does not announce it in its IDENTIFY answer).
DEFAULT_MAX_REQ_TIMEOUT = 3600.0
#: States before READY: frames are answers to the handshake, bounded by MAX_ANSWER_SIZE.
_HANDSHAKE_STATES = frozenset(
    {_S.IDENTIFYING, _S.AWAITING_TLS_OK, _S.AWAITING_COMPRESSION_OK, _S.AUTHENTICATING}
)
_HTTP_HINT = "is it nsqd's HTTP port? nsqd's TCP port is usually 4150"
#: What nsqlookupd's TCP port answers to protocol V2's magic: a size, then this error, unframed.
_LOOKUPD_REFUSAL = b"E_BAD_PROTOCOL"


class ClientConnection:
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

    __slots__ = (
        "_accepts_messages",
        "_allowed",
        "_as",
        "_auth_requires_tls",
        "_auth_secret",
        "_awaiting",
        "_ceiling",
        "_close_wait_received",
        "_codec",
        "_credit",
        "_expiry_window",
        "_frame_limit",
        "_group",
        "_group_bytes",
        "_group_sizes",
        "_held_history",
        "_in_flight",
        "_last_received",
        "_max_frame_size",
        "_max_req_timeout",
        "_next_request_id",
        "_out",
        "_out_plain",
        "_peer",
        "_pending",
        "_pending_need",
        "_pub_headers",
        "_rdy",
        "_rdy_remaining",
        "_requested",
        "_state",
        "_switch",
        "_tail_pub",
        "_unsolicited",
        "auth",
        "channel",
        "heartbeat_interval",
        "settings",
        "topic",
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
        fields: dict[str, Any] = dict(identify or {})
        fields["feature_negotiation"] = True
        if fields.get("snappy") and fields.get("deflate"):
            raise LocalProtocolError("snappy and deflate are mutually exclusive; ask for one")
        self._requested = fields
        interval = fields.get("heartbeat_interval", 0)
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int)
            or not (interval in (-1, 0) or interval >= 1000)
        ):
            raise LocalProtocolError(
                f"heartbeat_interval must be an int of ms: -1 (off), 0 (nsqd's default) or "
                f">= 1000, got {interval!r}"
            )
        if interval == 0:
            interval = _DEFAULT_HEARTBEAT_MS
        #: Seconds between nsqd's heartbeats, or None when they were disabled (-1).
        self.heartbeat_interval: float | None = None if interval < 0 else interval / 1000
        if isinstance(auth_secret, str):
            auth_secret = auth_secret.encode()
        self._auth_secret = auth_secret
        self._auth_requires_tls = bool(auth_requires_tls)
        if max_req_timeout is not None:
            _milliseconds("max_req_timeout", max_req_timeout)  # a number of seconds, in range
        self._max_req_timeout = max_req_timeout
        self._peer = peer
        self._max_frame_size = max_frame_size
        frames.FrameDecoder(max_frame_size)  # validates the limit with the same rule
        #: Frames are answers to the handshake until READY: none may be larger than this.
        self._frame_limit = min(max_frame_size, MAX_ANSWER_SIZE + 4)
        self._state = _S.IDENTIFYING
        #: The unfinished frame's bytes (one bytearray: memory stays within one frame's size).
        self._pending = bytearray()
        self._pending_need = 8
        self._accepts_messages = False
        #: Set by :meth:`_receive_as` for one call: the type and fields of message handles.
        self._as: tuple[type, int, object, float, float] | None = None
        self._out: list[bytes] = [frames.MAGIC_V2, frames.encode_identify(fields)]
        self._out_plain: bytes = b""
        self._codec: Codec | None = None
        self._switch = False
        self._awaiting: deque[tuple[_Awaiting, int]] = deque([(_Awaiting.IDENTIFY, 0)])
        self._next_request_id = 1
        #: ``PUB <topic>\n`` per topic already validated (the hot path of one-message PUB).
        self._pub_headers: dict[str, bytes] = {}
        #: The last command queued, when it is a PUB others may still join (not written yet):
        #: (topic, its awaiting entry, its index in ``_out``, its body).
        self._tail_pub: tuple[str, tuple[_Awaiting, int], int, bytes] | None = None
        #: The PUBs coalesced so far with that one (None: it is alone).
        self._group: list[bytes] | None = None
        self._group_bytes = 0
        #: How many request ids each coalesced MPUB answers, by its first id.
        self._group_sizes: dict[int, int] = {}
        self._in_flight: set[bytes] = set()
        self._rdy = 0
        self._rdy_remaining = 0
        #: The RDY bound: the RDY nsqd may still be applying, and how many messages may still
        #: come under it after a lower RDY was sent (nsqd reads the new one later).
        self._ceiling = 0
        self._credit = 0
        self._allowed = 0
        #: A message received this long ago (s) may have timed out on nsqd (half its timeout).
        self._expiry_window = _DEFAULT_MSG_TIMEOUT_MS / 2000
        #: [when, most messages held after a read then]: one entry per 1/32 of the window, so
        #: how many held messages may have timed out is known without a time per message.
        self._held_history: deque[list[float]] = deque()
        self._close_wait_received = False
        #: Heartbeats and late-answer errors in the current receive_data() call.
        self._unsolicited = 0
        self._last_received: float | None = None
        self.settings: ServerSettings | None = None
        self.auth: AuthResult | None = None
        self.topic: str | None = None
        self.channel: str | None = None

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
    def rdy(self) -> int:
        """The last RDY count sent."""
        return self._rdy

    @property
    def rdy_remaining(self) -> int:
        """RDY count left: the last one sent minus the messages received since."""
        return self._rdy_remaining

    @property
    def in_flight(self) -> frozenset[bytes]:
        """Ids of messages received and not yet finished or requeued (a snapshot)."""
        return frozenset(self._in_flight)

    @property
    def in_flight_count(self) -> int:
        """Messages delivered on this connection and not answered yet (FIN, REQ) here."""
        return len(self._in_flight)

    def is_in_flight(self, message_id: bytes) -> bool:
        """Whether ``message_id`` was delivered here and is still unanswered."""
        return message_id in self._in_flight

    @property
    def rdy_bound(self) -> int:
        """The most messages nsqd may have this connection hold (unanswered and not timed out)
        before the connection refuses it: twice the RDY nsqd may still be applying."""
        return self._allowed

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
        self._state = _S.AWAITING_TLS_OK

    # --- commands ------------------------------------------------------------------------------

    def subscribe(self, topic: str, channel: str) -> None:
        """``SUB``: receive messages of ``topic`` on ``channel`` (after RDY)."""
        self._require("subscribe()", (_S.READY,))
        self._out.append(frames.encode_sub(topic, channel))
        self._awaiting.append((_Awaiting.SUB, 0))
        self.topic = topic
        self.channel = channel
        self._state = _S.SUBSCRIBING

    def send_ready(self, count: int) -> None:
        """``RDY count``: allow up to ``count`` messages in flight on this connection.

        nsqd sends a message only while the messages in flight to this client are fewer than
        its RDY, so the connection holds it to that: when the messages held (received, not
        answered, and not old enough to have timed out on nsqd: half the message timeout)
        would exceed :attr:`rdy_bound`, the connection fails with
        :class:`~nsq_sansio.errors.ReadyCountExceeded` and the messages beyond are not
        delivered. The bound is twice the RDY (nsqd forgets the messages in flight when a
        channel is emptied, and may then send a whole RDY again); after a lower RDY, the old
        one still applies to as many messages as it allowed (sent before nsqd read the new one).
        """
        self._require("send_ready()", (_S.SUBSCRIBING, _S.SUBSCRIBED, _S.CLOSING))
        if isinstance(count, bool) or not isinstance(count, int):
            raise LocalProtocolError(f"RDY count must be an int, got {count!r}")
        limit = self.max_rdy_count
        if not 0 <= count <= limit:
            raise LocalProtocolError(
                f"RDY count {count} is outside 0..{limit} (nsqd's max_rdy_count)"
            )
        if self._state is _S.CLOSING and count:
            raise LocalProtocolError(f"RDY {count} in state CLOSING: only RDY 0 makes sense")
        self._out.append(b"RDY %d\n" % count)
        self._rdy = self._rdy_remaining = count
        if count >= self._ceiling:  # nsqd may apply a lower one until it reads this: no matter
            self._ceiling = count
            self._credit = 0
            self._allowed = 2 * count
        else:  # up to the old RDY's worth may still come under it
            self._credit = self._ceiling

    def finish(self, message_id: bytes) -> None:
        """``FIN``: the message was handled and can be forgotten."""
        try:
            self._in_flight.remove(message_id)  # only ever filled in SUBSCRIBED or CLOSING
        except (KeyError, TypeError):
            self._settle("finish()", message_id)  # raises the precise error
        self._out.append(b"FIN " + message_id + b"\n")

    def finish_many(self, message_ids: Sequence[bytes]) -> None:
        """``FIN`` each id, in order: :meth:`finish` on each, in one call (the FIN lines are
        joined in C). All or nothing: when one id is not in flight (or comes twice), nothing
        is sent and the error :meth:`finish` would raise for it is raised."""
        if type(message_ids) is not list and type(message_ids) is not tuple:
            message_ids = list(message_ids)
        in_flight = self._in_flight
        try:
            if in_flight.issuperset(message_ids):
                before = len(in_flight)
                in_flight.difference_update(message_ids)
                if before - len(in_flight) == len(message_ids):
                    if message_ids:
                        self._out.append(b"FIN " + b"\nFIN ".join(message_ids) + b"\n")
                    return
                in_flight.update(message_ids)  # an id came twice: put them back
        except TypeError:  # an unhashable id: finish() says what is wrong with it
            pass
        seen: set[bytes] = set()
        for message_id in message_ids:  # find the one finish() refuses, and raise its error
            if not isinstance(message_id, bytes) or message_id not in in_flight:
                self._settle("finish()", message_id)
            if message_id in seen:
                raise self._not_in_flight("finish()", message_id)
            seen.add(message_id)
        for message_id in message_ids:  # pragma: no cover - not reached (one was refused)
            self.finish(message_id)

    def requeue(self, message_id: bytes, delay: float = 0.0) -> None:
        """``REQ``: hand the message back, to be delivered again after ``delay`` seconds.

        A delay above :attr:`max_req_timeout`, when it is known, raises
        :class:`~nsq_sansio.errors.DelayOutOfRange` (nsqd would shorten it silently)."""
        delay_ms = _milliseconds("requeue() delay", delay)
        if self._max_req_timeout is not None and delay > self._max_req_timeout:
            raise self._delay_error("requeue()", delay, self._max_req_timeout, assumed=False)
        self._settle("requeue()", message_id)
        self._out.append(frames.encode_req(message_id, delay_ms))

    def touch(self, message_id: bytes) -> None:
        """``TOUCH``: reset the message's timeout on nsqd (up to its max_msg_timeout)."""
        self._require("touch()", _MESSAGE_STATES)
        frames.check_message_id(message_id)
        if message_id not in self._in_flight:
            raise self._not_in_flight("touch()", message_id)
        self._out.append(frames.encode_touch(message_id))

    def publish(self, topic: str, body: bytes, coalesce: bool = False) -> int:
        """``PUB``; returns the request id its answer will carry.

        With ``coalesce``, a PUB to the topic of the PUB queued just before it (also with
        ``coalesce``, and not yet taken by :meth:`data_to_send`) joins that one: they go out as
        one MPUB (up to :data:`COALESCE_BYTES` of bodies), one write and one answer for nsqd
        instead of one each. Its answer is still one event per request id: a
        :class:`PublishAcknowledged` each, or, if nsqd refused the MPUB, a
        :class:`PublishFailed` each with :class:`CoalescedPublishRefused` (nothing of it was
        stored: send each again without ``coalesce`` to get its own answer).
        """
        state = self._state
        if state is not _S.READY and state not in _PUBLISH_STATES:  # READY: no enum hash
            self._require("publish()", _PUBLISH_STATES)
        tail = self._tail_pub
        if tail is not None:
            if (
                coalesce
                and tail[0] == topic
                and type(body) is bytes
                and body
                and self._awaiting
                and self._awaiting[-1] is tail[1]
                and self._group_bytes + len(body) <= COALESCE_BYTES
            ):
                request_id = self._next_request_id
                self._next_request_id = request_id + 1
                self._group_bytes += len(body)
                group = self._group
                if group is not None:
                    group.append(body)
                else:  # the second one: the first PUB's answer becomes the group's
                    entry = (_GROUP_AWAITING, tail[1][1])
                    self._awaiting[-1] = entry
                    self._tail_pub = (topic, entry, tail[2], tail[3])
                    self._group = [tail[3], body]
                return request_id
            self._close_group()
        header = self._pub_headers.get(topic)
        if header is None or type(body) is not bytes or not body or len(body) > _MAX_BODY:
            # First PUB to this topic, or a body to check: the full encoder says what is wrong.
            command = frames.encode_pub(topic, body)
            if len(self._pub_headers) >= _PUB_HEADERS_KEPT:
                self._pub_headers.clear()
            self._pub_headers[topic] = command[: 5 + len(topic)]
        else:
            command = header + _SIZE.pack(len(body)) + body
        request_id = self._next_request_id
        self._next_request_id = request_id + 1
        self._out.append(command)
        entry = (_PUBLISH_AWAITING, request_id)
        self._awaiting.append(entry)
        if coalesce and type(body) is bytes:
            self._tail_pub = (topic, entry, len(self._out) - 1, body)
            self._group_bytes = len(body)
        return request_id

    def _close_group(self) -> None:
        """No more PUBs join the last one: write the coalesced MPUB into its place."""
        tail = self._tail_pub
        assert tail is not None
        self._tail_pub = None
        group = self._group
        if group is None:
            return
        self._group = None
        topic, (_, first_id), slot, _ = tail
        self._group_sizes[first_id] = len(group)
        self._out[slot] = frames.encode_checked_mpub(topic, group)

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> int:
        """``MPUB`` (atomic); returns the request id its answer will carry."""
        self._require("multi_publish()", _PUBLISH_STATES)
        return self._request(frames.encode_mpub(topic, bodies))

    def deferred_publish(self, topic: str, body: bytes, delay: float) -> int:
        """``DPUB``: deliverable after ``delay`` seconds; returns the request id.

        A delay above nsqd's ``max_req_timeout`` (:attr:`max_req_timeout`, or nsqd's default
        of an hour when it is not known) raises :class:`~nsq_sansio.errors.DelayOutOfRange`:
        nsqd would refuse it with a fatal ``E_INVALID`` and close the connection."""
        self._require("deferred_publish()", _PUBLISH_STATES)
        delay_ms = _milliseconds("deferred_publish() delay", delay)
        check_deferred_delay(delay, self._max_req_timeout)
        return self._request(frames.encode_dpub(topic, delay_ms, body))

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
            self._awaiting.append((_Awaiting.CLS, 0))
            self._state = _S.CLOSING
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

    @property
    def pending_requests(self) -> tuple[int, ...]:
        """Publish request ids still waiting for their answer, oldest first."""
        ids: list[int] = []
        for kind, rid in self._awaiting:
            if kind is _PUBLISH_AWAITING:
                ids.append(rid)
            elif kind is _GROUP_AWAITING:
                size = self._group_sizes.get(rid)  # kept once written
                if size is None:  # the group still open
                    assert self._group is not None
                    size = len(self._group)
                ids.extend(range(rid, rid + size))
        return tuple(ids)

    # --- internals -----------------------------------------------------------------------------

    def _require(self, what: str, states: Iterable[ConnectionState]) -> None:
        if self._state not in states:
            allowed = ", ".join(s.name for s in states)
            raise LocalProtocolError(
                f"{what} is not allowed in state {self._state.name} (only in {allowed})"
            )

    def _not_in_flight(self, what: str, message_id: bytes) -> LocalProtocolError:
        return LocalProtocolError(
            f"{what}: message {message_id.decode('ascii', 'backslashreplace')} is not in flight "
            "on this connection "
            "(already answered, or never received here)"
        )

    def _settle(self, what: str, message_id: bytes) -> None:
        if self._state is not _S.SUBSCRIBED and self._state is not _S.CLOSING:
            self._require(what, _MESSAGE_STATES)
        frames.check_message_id(message_id)
        try:
            self._in_flight.remove(message_id)
        except KeyError:
            raise self._not_in_flight(what, message_id) from None

    @staticmethod
    def _delay_error(what: str, delay: float, limit: float, *, assumed: bool) -> DelayOutOfRange:
        where = (
            "nsqd's default --max-req-timeout (nsqd does not announce its own: give "
            "max_req_timeout if this nsqd allows more)"
            if assumed
            else "nsqd's --max-req-timeout"
        )
        return DelayOutOfRange(
            f"{what} delay of {delay:g} seconds is above the {limit:g} seconds of {where}; "
            "delays are in seconds, not milliseconds",
            delay=delay,
            limit=limit,
        )

    def _request(self, command: bytes) -> int:
        request_id = self._next_request_id
        self._next_request_id = request_id + 1
        self._out.append(command)
        self._awaiting.append((_Awaiting.PUBLISH, request_id))
        return request_id

    def _decompress_and_process(self, data: bytes, events: list[Event]) -> None:
        codec = self._codec
        assert codec is not None
        try:
            for piece in codec.decompress_iter(data):
                self._process(piece, events)
                if self._state is _S.CLOSED:
                    return
        except CompressionError as exc:
            self._fail(exc, events)

    def _process(self, data: bytes, events: list[Event]) -> None:
        """Decode every complete frame (the hot path).

        The working buffer is an immutable ``bytes``, so each body is one slice (one copy).
        An unfinished frame waits in the ``_pending`` bytearray until it is complete. A
        message frame takes one ``unpack_from`` (frame and message headers together) and no
        Python-level constructor; the RDY bound is checked once per run of messages.
        """
        pending = self._pending
        if pending:
            pending += data
            if len(pending) < self._pending_need:
                return
            data = bytes(pending)
            pending.clear()
        end = len(data)
        last = end - 34  # a message frame's headers start at or before this
        pos = 0
        limit = self._frame_limit
        unpack_frame = _FRAME_AND_MESSAGE_HEADER.unpack_from
        unpack_header = _HEADER.unpack_from
        add = self._in_flight.add
        append = events.append
        new = _new_tuple
        handle = self._as
        mark = len(events)  # events[mark:] are messages not counted against RDY yet
        try:
            while True:
                # The hot loops: complete message frames, while messages may come (2 is the
                # message frame type; -1 matches nothing). Anything else breaks out.
                deliverable = 2 if self._accepts_messages else -1
                if handle is None:
                    while pos <= last:
                        size, frame_type, timestamp, attempts, message_id = unpack_frame(data, pos)
                        stop = pos + 4 + size
                        if stop > end or frame_type != deliverable or size < 30 or size > limit:
                            break
                        add(message_id)
                        append(
                            new(Message, (message_id, data[pos + 34 : stop], timestamp, attempts))
                        )
                        pos = stop
                else:
                    handle_type, conn_id, address, received_at, deadline = handle
                    while pos <= last:
                        size, frame_type, timestamp, attempts, message_id = unpack_frame(data, pos)
                        stop = pos + 4 + size
                        if stop > end or frame_type != deliverable or size < 30 or size > limit:
                            break
                        add(message_id)
                        append(
                            new(
                                handle_type,
                                (
                                    conn_id,
                                    message_id,
                                    data[pos + 34 : stop],
                                    timestamp,
                                    attempts,
                                    address,
                                    received_at,
                                    deadline,
                                ),
                            )
                        )
                        pos = stop
                if end - pos < 8:
                    break
                size, frame_type = unpack_header(data, pos)
                stop = pos + 4 + size
                # Anything else, in the order the checks matter: a bad size, an unfinished
                # frame, a bad message frame, a response or an error.
                if size < 4 or size > limit:
                    frames.check_frame_size(size, limit)
                if stop > end:
                    break
                if frame_type == 2:
                    if size < 30:
                        raise RemoteProtocolError(f"message frame of {size} bytes is too short")
                    raise RemoteProtocolError(f"message received in state {self._state.name}")
                if len(events) > mark:
                    self._count_received(len(events) - mark, events)
                payload = data[pos + 8 : stop]
                pos = stop
                if frame_type == 0:
                    self._on_response(payload, events)
                    limit = self._frame_limit  # READY lifts the handshake's limit
                elif frame_type == 1:
                    self._on_error(payload, events)
                else:
                    raise RemoteProtocolError(f"unknown frame type {frame_type}")
                if self._switch or self._state is _S.CLOSED:
                    break
                mark = len(events)
            if len(events) > mark:
                self._count_received(len(events) - mark, events)
            if self._state is _S.CLOSED:
                return
            if end - pos >= 4 and not self._switch:
                need = 4 + _SIZE.unpack_from(data, pos)[0]
                frames.check_frame_size(need - 4, limit)
            else:
                need = 8
        except (NSQError, ValueError, RecursionError) as exc:  # bad (or absurdly nested) JSON
            error = (
                exc if isinstance(exc, NSQError) else RemoteProtocolError(f"bad answer: {exc!r}")
            )
            if self._state in _HANDSHAKE_STATES and isinstance(error, RemoteProtocolError):
                error = self._handshake_error(error, data, pos)
            # Reported as a value, not raised: its traceback would hold this frame, whose
            # ``events`` hold the error (a cycle keeping every message decoded so far, and
            # the read itself, until a full garbage collection).
            exc.__traceback__ = error.__traceback__ = None
            self._fail(error, events)
            return
        if pos < end:
            pending += memoryview(data)[pos:]
            self._pending_need = need
        if self._switch:
            self._apply_switch(events)

    def _count_received(self, count: int, events: list[Any]) -> None:
        """``count`` messages arrived (the last ones of ``events``): RDY left goes down by as
        many (not below 0), and the messages held must stay within the RDY bound."""
        left = self._rdy_remaining - count
        self._rdy_remaining = left if left > 0 else 0
        held = len(self._in_flight)
        if held > self._allowed:
            self._check_bound(count, events)  # raises when nsqd broke it
        if self._credit:  # messages that came under an RDY higher than the last one
            credit = self._credit - count
            if credit > 0:
                self._credit = credit
            else:
                self._credit = 0
                self._ceiling = self._rdy
                self._allowed = 2 * self._rdy
        now = self._last_received
        if now is not None:
            history = self._held_history
            if history and now < history[-1][0] + self._expiry_window / 32:
                last = history[-1]
                if held > last[1]:
                    last[1] = held
            else:
                history.append([now, held])
                cutoff = now - self._expiry_window  # older entries can no longer matter
                while len(history) > 1 and history[1][0] <= cutoff:
                    history.popleft()

    def _check_bound(self, count: int, events: list[Any]) -> None:
        """More messages are held than the bound allows: leave out those that nsqd may have
        timed out already, and if that is still too many, refuse the peer (the messages beyond
        the bound are taken out of ``events``: nsqd requeues them when the connection closes).

        A message received before ``now - expiry window`` may have timed out: at most as many
        as were held then (the history's entry for that time), and none of this read's."""
        in_flight = self._in_flight
        held = len(in_flight)
        now = self._last_received
        if now is not None:
            cutoff = now - self._expiry_window
            held_then = 0
            for when, most in self._held_history:
                if when > cutoff:
                    break
                held_then = int(most)
            held -= min(held_then, held - count)
        allowed = self._allowed
        if held <= allowed:
            return
        excess = min(held - allowed, count)
        index = 0 if self._as is None else 1  # where a Message or a handle keeps the id
        for event in events[len(events) - excess :]:
            in_flight.discard(event[index])
        del events[len(events) - excess :]
        rdy = (
            f"RDY {self._rdy}"
            if self._ceiling == self._rdy
            else f"RDY {self._ceiling} (until nsqd reads the RDY {self._rdy} sent after it)"
        )
        raise ReadyCountExceeded(
            f"nsqd sent more messages than RDY allows: {held} would be held (unanswered and "
            f"within their timeout) with {rdy}, at most {allowed} allowed; the last {excess} "
            "were not delivered (nsqd requeues them when the connection closes)",
            held=held,
            rdy=self._ceiling,
            allowed=allowed,
        )

    def _handshake_error(self, error: RemoteProtocolError, data: bytes, pos: int) -> NSQError:
        """What broke the handshake, said plainly when the peer is not nsqd's TCP port at all
        (nsqd's HTTP port, nsqlookupd) or sent an answer far larger than nsqd's."""
        if self._state is _S.IDENTIFYING:
            who = self._peer or "the server"
            head = data[pos : pos + 5]
            if len(head) >= 4 and b"HTTP/".startswith(head):  # "HTTP" read as a frame size
                line = data[pos:].split(b"\r\n", 1)[0][:64].decode("ascii", "replace")
                return WrongPort(
                    f"{who} answered like an HTTP server ({line!r}): {_HTTP_HINT}", "HTTP"
                )
            if data.startswith(_LOOKUPD_REFUSAL, 4):  # nsqlookupd's answer to any magic but V1
                return WrongPort(
                    f"{who} answered like nsqlookupd (E_BAD_PROTOCOL to protocol V2): is it "
                    "nsqlookupd's TCP port, usually 4160? nsqd's TCP port is usually 4150",
                    "nsqlookupd",
                )
        if isinstance(error, FrameTooLarge):  # still one, with the handshake's own limit said
            error.args = (
                f"nsqd announced a {error.size}-byte frame in state {self._state.name}; "
                f"answers to IDENTIFY and AUTH are read up to {MAX_ANSWER_SIZE} bytes",
            )
        return error

    def _apply_switch(self, events: list[Event]) -> None:
        self._switch = False
        trailing = bytes(self._pending)
        self._pending.clear()
        if self._state is _S.TLS_HANDSHAKE:
            events.append(TLSUpgradeRequired(trailing))
        elif trailing:
            self._decompress_and_process(trailing, events)

    def _on_response(self, payload: bytes, events: list[Event]) -> None:
        if payload == frames.HEARTBEAT:
            self._count_unsolicited("heartbeats")
            self._out.append(b"NOP\n")
            events.append(Heartbeat())
            return
        if not self._awaiting:
            raise RemoteProtocolError(
                f"unexpected response {payload[:64]!r} in state {self._state.name}"
            )
        kind, request_id = self._awaiting.popleft()
        if kind is _Awaiting.PUBLISH:
            if payload != frames.OK:
                error = RemoteProtocolError(f"publish answered {payload[:64]!r} instead of OK")
                events.append(PublishFailed(request_id, error))
                raise error
            events.append(PublishAcknowledged(request_id))
        elif kind is _GROUP_AWAITING:
            ids = range(request_id, request_id + self._group_sizes.pop(request_id))
            if payload != frames.OK:
                error = RemoteProtocolError(f"publish answered {payload[:64]!r} instead of OK")
                events.extend(PublishFailed(rid, error) for rid in ids)
                raise error
            events.extend(map(PublishAcknowledged, ids))
        elif kind is _Awaiting.IDENTIFY:
            self._on_identify(payload, events)
        elif kind is _Awaiting.TLS_OK or kind is _Awaiting.COMPRESSION_OK:
            if payload != frames.OK:
                raise RemoteProtocolError(
                    f"expected OK after the {kind.name} upgrade, got {payload[:64]!r}"
                )
            if kind is _Awaiting.TLS_OK and self._start_compression():
                return
            self._after_upgrades(events)
        elif kind is _Awaiting.AUTH:
            self._on_auth(payload, events)
        elif kind is _Awaiting.SUB:
            if payload != frames.OK:
                raise RemoteProtocolError(f"SUB answered {payload[:64]!r} instead of OK")
            self._state = _S.SUBSCRIBED
            self._accepts_messages = True
            assert self.topic is not None and self.channel is not None
            events.append(Subscribed(self.topic, self.channel))
        else:  # CLS
            if payload != frames.CLOSE_WAIT:
                raise RemoteProtocolError(f"CLS answered {payload[:64]!r} instead of CLOSE_WAIT")
            self._close_wait_received = True
            self._rdy = self._rdy_remaining = 0
            # nsqd set its RDY to 0 before answering; its message pump may still write the one
            # message it had decided to send under the old RDY, and nothing after it.
            self._credit = 1 if self._ceiling else 0
            events.append(CloseWait())

    def _on_identify(self, payload: bytes, events: list[Event]) -> None:
        requested = self._requested
        if payload == frames.OK:
            # An nsqd from before feature negotiation: none of the features can be had.
            self.settings = settings = ServerSettings.default()
            self._check_features(settings, negotiated=False)
            self._after_upgrades(events)
            return
        _check_answer_size("IDENTIFY", payload)
        data = json.loads(payload)
        if not isinstance(data, dict):
            raise RemoteProtocolError(f"IDENTIFY answer is not a JSON object: {payload[:64]!r}")
        settings = ServerSettings.from_json(data)
        for feature in ("tls_v1", "snappy", "deflate"):
            if getattr(settings, feature) and not requested.get(feature):
                raise RemoteProtocolError(f"nsqd enabled {feature}, which was not requested")
        self._check_features(settings, negotiated=True)
        self.settings = settings
        self._expiry_window = settings.msg_timeout / 2000
        max_req = data.get("max_req_timeout")  # not nsqd's (it does not say), a broker's may
        if (
            self._max_req_timeout is None
            and isinstance(max_req, int)
            and not isinstance(max_req, bool)
            and 0 <= max_req <= _MAX_DELAY_MS
        ):
            self._max_req_timeout = max_req / 1000
        if settings.tls_v1:
            self._awaiting.append((_Awaiting.TLS_OK, 0))
            self._state = _S.TLS_HANDSHAKE
            self._switch = True
            return
        if not self._start_compression():
            self._after_upgrades(events)

    def _check_features(self, settings: ServerSettings, *, negotiated: bool) -> None:
        """Every feature asked for must be granted: one that is not fails the connection for
        good (the same nsqd answers the same way to every reconnect)."""
        requested = self._requested
        who = self._peer or "nsqd"
        why = "" if negotiated else " (it is too old to negotiate features)"
        if requested.get("tls_v1") and not settings.tls_v1:
            fix = "give nsqd a certificate (--tls-cert, --tls-key)" if negotiated else "upgrade it"
            raise TLSUnavailable(
                f"TLS was requested (tls_v1) but {who} did not enable it{why}: {fix}, "
                "or turn tls_v1 off"
            )
        for feature in ("snappy", "deflate"):
            if requested.get(feature) and not getattr(settings, feature):
                fix = f"nsqd runs with --{feature}=false?" if negotiated else "upgrade it"
                raise CompressionUnavailable(
                    f"{feature} compression was requested but {who} did not enable it{why} "
                    f"({fix}): turn {feature} off in this client's configuration, or on in nsqd",
                    feature,
                )

    def _start_compression(self) -> bool:
        """Switch compression on for both directions, if negotiated; True when it was."""
        settings = self.settings
        assert settings is not None
        if settings.snappy:
            self._codec = SnappyCodec()
        elif settings.deflate:
            # Our own output's level is ours to pick; follow nsqd's where it is a valid one.
            level = settings.deflate_level if 1 <= settings.deflate_level <= 9 else 6
            self._codec = DeflateCodec(level)
        else:
            return False
        # Whatever was queued before the switch goes out uncompressed.
        self._out_plain += b"".join(self._out)
        self._out.clear()
        self._awaiting.append((_Awaiting.COMPRESSION_OK, 0))
        self._state = _S.AWAITING_COMPRESSION_OK
        self._switch = True
        return True

    def _after_upgrades(self, events: list[Event]) -> None:
        settings = self.settings
        assert settings is not None
        if settings.auth_required:
            who = self._peer or "nsqd"
            if self._auth_secret is None:
                raise AuthSecretMissing(
                    f"{who} requires AUTH (it has an auth server, --auth-http-address) and no "
                    "auth secret is configured: set auth_secret"
                )
            if self._auth_requires_tls and not settings.tls_v1:
                raise InsecureAuthRefused(
                    f"{who} requires AUTH and the connection is not TLS: auth_requires_tls "
                    "refuses to send the secret in clear; turn tls_v1 on (nsqd needs "
                    "--tls-cert and --tls-key)"
                )
            self._out.append(frames.encode_auth(self._auth_secret))
            self._awaiting.append((_Awaiting.AUTH, 0))
            self._state = _S.AUTHENTICATING
            return
        self._state = _S.READY
        self._frame_limit = self._max_frame_size
        events.append(ConnectionReady(settings, None))

    def _on_auth(self, payload: bytes, events: list[Event]) -> None:
        _check_answer_size("AUTH", payload)
        data = json.loads(payload)
        if not isinstance(data, dict):
            raise RemoteProtocolError(f"AUTH answer is not a JSON object: {payload[:64]!r}")
        count = data.get("permission_count", 0)
        if isinstance(count, bool) or not isinstance(count, int):
            raise RemoteProtocolError(f"AUTH answer permission_count must be an int, got {count!r}")
        self.auth = AuthResult(
            identity=str(data.get("identity", "")),
            identity_url=str(data.get("identity_url", "")),
            permission_count=count,
            raw=data,
        )
        self._state = _S.READY
        self._frame_limit = self._max_frame_size
        assert self.settings is not None
        events.append(ConnectionReady(self.settings, self.auth))

    def _count_unsolicited(self, what: str) -> None:
        """Heartbeats and late-answer errors answer nothing pending, so nothing else bounds
        them: one read may bring a few heartbeats, and a late-answer error per message held,
        never more (a compressed read could otherwise expand into millions of events)."""
        self._unsolicited += 1
        limit = _UNSOLICITED_PER_READ + 2 * self.max_rdy_count
        if self._unsolicited > limit:
            raise RemoteProtocolError(
                f"nsqd sent more than {limit} heartbeats and late-answer errors in one read "
                f"(the last were {what})"
            )

    def _on_error(self, payload: bytes, events: list[Event]) -> None:
        error = ServerError.from_frame(payload)
        command = _NON_FATAL_COMMANDS.get(error.code)
        if command is not None:
            self._count_unsolicited(f"{error.code} errors")
            events.append(MessageTakenBack(_message_id_in(error.text), command, error))
            return
        if self._awaiting:
            kind = self._awaiting[0][0]
            if kind is _Awaiting.PUBLISH:
                events.append(PublishFailed(self._awaiting.popleft()[1], error))
            elif kind is _GROUP_AWAITING:
                first = self._awaiting.popleft()[1]
                refused = CoalescedPublishRefused(error)
                for rid in range(first, first + self._group_sizes.pop(first)):
                    events.append(PublishFailed(rid, refused))
            elif kind is _Awaiting.IDENTIFY:
                # A refused IDENTIFY is the configuration's fault: retrying cannot help.
                self._fail(IdentifyRejected(error), events)
                return
        self._fail(error, events)

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
        self._state = _S.CLOSED
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


#: Longest delay a command may carry (ms): what a signed 32-bit value holds, ~24.8 days.
_MAX_DELAY_MS = 2**31 - 1
#: The same in seconds, for callers that clamp before asking.
MAX_COMMAND_DELAY = _MAX_DELAY_MS / 1000


def check_deferred_delay(delay: float, max_req_timeout: float | None = None) -> None:
    """Raise :class:`~nsq_sansio.errors.DelayOutOfRange` for a DPUB delay (seconds) above
    nsqd's ``max_req_timeout``, or above nsqd's default of an hour when it is not given: nsqd
    refuses it (a fatal ``E_INVALID`` over TCP, ``400 INVALID_DEFER`` over HTTP). For
    publishers without a :class:`ClientConnection`, such as nsqd's HTTP ``/pub?defer=``."""
    limit = DEFAULT_MAX_REQ_TIMEOUT if max_req_timeout is None else max_req_timeout
    if delay > limit:
        raise ClientConnection._delay_error(
            "deferred_publish()", delay, limit, assumed=max_req_timeout is None
        )


def _milliseconds(what: str, seconds: float) -> int:
    """Seconds to whole milliseconds, refusing negative, NaN, infinite and absurd values."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise LocalProtocolError(f"{what} must be a number of seconds, got {seconds!r}")
    if not 0 <= seconds <= _MAX_DELAY_MS / 1000:
        raise LocalProtocolError(
            f"{what} must be within 0..{_MAX_DELAY_MS / 1000:.0f} seconds, got {seconds!r}"
        )
    return round(seconds * 1000)


def _check_answer_size(what: str, payload: bytes) -> None:
    """nsqd's IDENTIFY and AUTH answers are small JSON objects: a huge one is not parsed."""
    if len(payload) > MAX_ANSWER_SIZE:
        raise RemoteProtocolError(
            f"{what} answer of {len(payload)} bytes is above the {MAX_ANSWER_SIZE} bytes "
            "read for it (nsqd's is a few hundred)"
        )


def _message_id_in(text: str) -> bytes | None:
    """nsqd's late-answer errors read like ``FIN <id> failed ID not in flight``."""
    for token in text.split():
        if len(token) == frames.MESSAGE_ID_SIZE:
            try:
                return token.encode("ascii")
            except UnicodeEncodeError:  # pragma: no cover - non-ASCII never matches an id
                continue
    return None
