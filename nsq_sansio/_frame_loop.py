"""A client connection's frame loop: the bytes nsqd sends, decoded into events.

Rules:

* Frames are decoded where they stand in the read (one slice per body); an unfinished frame
  waits, and memory stays within one frame's size. Until READY, no frame may be larger than
  an answer to the handshake.
* Decoding stops at the byte where nsqd switches to TLS or compression: what follows belongs
  to the new layer.
* Answers are matched to commands in order (:class:`Awaiting`); heartbeats are answered with
  NOP; late-answer errors (``E_FIN_FAILED``, ``E_REQ_FAILED``, ``E_TOUCH_FAILED``) are events,
  every other error ends the connection. Heartbeats and late-answer errors per read are bounded.
* Each run of messages is counted against the RDY bound (``_subscribing.py``) before any
  other frame is handled.
* Nothing the peer sends raises: a broken stream ends the connection with the error as a value.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import TYPE_CHECKING, Any

from . import frames
from ._connection_lifecycle import HANDSHAKE_STATES, Awaiting, ConnectionState, Lifecycle
from .compression import Codec
from .errors import (
    CoalescedPublishRefused,
    CompressionError,
    IdentifyRejected,
    NSQError,
    RemoteProtocolError,
    ServerError,
)
from .events import (
    CloseWait,
    Event,
    Heartbeat,
    Message,
    MessageTakenBack,
    PublishAcknowledged,
    PublishFailed,
    Subscribed,
    TLSUpgradeRequired,
)

__all__ = ["FrameLoop"]

_S = ConnectionState
_GROUP_AWAITING = Awaiting.PUBLISH_GROUP
_HEADER = struct.Struct(">II")
_SIZE = struct.Struct(">I")
#: A frame header and a message header (timestamp, attempts) in one unpack.
_FRAME_AND_MESSAGE_HEADER = struct.Struct(">IIqH16s")
_new_tuple = tuple.__new__
_NON_FATAL_COMMANDS = {"E_FIN_FAILED": "FIN", "E_REQ_FAILED": "REQ", "E_TOUCH_FAILED": "TOUCH"}
#: Heartbeats and late-answer errors one read may bring, beyond one error per message that
#: may be held (twice nsqd's max_rdy_count).
_UNSOLICITED_PER_READ = 64


class FrameLoop:
    """The frame loop of :class:`~nsq_sansio.connection.ClientConnection` (a part of it: the
    connection's ``__slots__`` hold these fields)."""

    if not TYPE_CHECKING:  # the fields are in the connection's __slots__ (one layout for all)
        __slots__ = ()

    #: The unfinished frame's bytes (one bytearray: memory stays within one frame's size).
    _pending: bytearray
    #: How many bytes the unfinished frame needs before it is worth decoding again.
    _pending_need: int
    #: The largest frame accepted now (an answer's size until READY).
    _frame_limit: int
    #: Whether message frames may come (SUBSCRIBED, CLOSING).
    _accepts_messages: bool
    #: Set by ``_receive_as`` for one call: the type and fields of message handles.
    _as: tuple[type, int, object, float, float] | None
    #: Heartbeats and late-answer errors in the current receive_data() call.
    _unsolicited: int
    _close_wait_received: bool
    # The connection's, shared with its other parts.
    _state: ConnectionState
    _switch: bool
    _codec: Codec | None
    _out: list[bytes]
    _awaiting: deque[tuple[Awaiting, int]]
    _group_sizes: dict[int, int]
    _in_flight: set[bytes]
    _rdy: int
    _rdy_remaining: int
    _ceiling: int
    _credit: int
    topic: str | None
    channel: str | None

    if TYPE_CHECKING:

        @property
        def max_rdy_count(self) -> int: ...
        def _enter(self, event: Lifecycle) -> None: ...
        def _fail(self, error: NSQError | None, events: list[Event]) -> None: ...
        def _count_received(self, count: int, events: list[Any]) -> None: ...
        def _on_identify(self, payload: bytes, events: list[Event]) -> None: ...
        def _on_upgraded(self, kind: Awaiting, payload: bytes, events: list[Event]) -> None: ...
        def _on_auth(self, payload: bytes, events: list[Event]) -> None: ...
        def _handshake_error(
            self, error: RemoteProtocolError, data: bytes, pos: int
        ) -> NSQError: ...

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
            if self._state in HANDSHAKE_STATES and isinstance(error, RemoteProtocolError):
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
        if kind is Awaiting.PUBLISH:
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
        elif kind is Awaiting.IDENTIFY:
            self._on_identify(payload, events)
        elif kind is Awaiting.TLS_OK or kind is Awaiting.COMPRESSION_OK:
            self._on_upgraded(kind, payload, events)
        elif kind is Awaiting.AUTH:
            self._on_auth(payload, events)
        elif kind is Awaiting.SUB:
            if payload != frames.OK:
                raise RemoteProtocolError(f"SUB answered {payload[:64]!r} instead of OK")
            self._enter(Lifecycle.SUB_OK)
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
            if kind is Awaiting.PUBLISH:
                events.append(PublishFailed(self._awaiting.popleft()[1], error))
            elif kind is _GROUP_AWAITING:
                first = self._awaiting.popleft()[1]
                refused = CoalescedPublishRefused(error)
                for rid in range(first, first + self._group_sizes.pop(first)):
                    events.append(PublishFailed(rid, refused))
            elif kind is Awaiting.IDENTIFY:
                # A refused IDENTIFY is the configuration's fault: retrying cannot help.
                self._fail(IdentifyRejected(error), events)
                return
        self._fail(error, events)


def _message_id_in(text: str) -> bytes | None:
    """nsqd's late-answer errors read like ``FIN <id> failed ID not in flight``."""
    for token in text.split():
        if len(token) == frames.MESSAGE_ID_SIZE:
            try:
                return token.encode("ascii")
            except UnicodeEncodeError:  # pragma: no cover - non-ASCII never matches an id
                continue
    return None
