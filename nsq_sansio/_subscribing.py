"""A client connection's subscriber side: SUB, the RDY nsqd is held to, and the messages in
flight answered with FIN, REQ and TOUCH.

Rules:

* A message is in flight from the frame that delivers it to its FIN or REQ, on this
  connection only; answering one that is not (already answered, never received here, or twice
  in one ``finish_many``) raises :class:`~nsq_sansio.errors.LocalProtocolError` and sends
  nothing.
* RDY is within ``0..max_rdy_count``; in CLOSING only RDY 0 is sent.
* nsqd is held to the RDY it was given: the messages held (received, unanswered, and not old
  enough to have timed out on nsqd: half the message timeout) stay within twice the RDY nsqd
  may still be applying (after a lower RDY, the old one applies to as many messages as it
  allowed). Beyond it, the peer is refused with
  :class:`~nsq_sansio.errors.ReadyCountExceeded` and the messages beyond are not delivered.
* Delays are checked before anything is queued: REQ's against nsqd's ``--max-req-timeout``
  when it is known.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import frames
from ._connection_lifecycle import MESSAGE_STATES, Awaiting, ConnectionState, Lifecycle
from ._publishing import delay_error, milliseconds
from .errors import LocalProtocolError, ReadyCountExceeded

__all__ = ["Subscribing"]

_S = ConnectionState


class Subscribing:
    """The subscriber's commands of :class:`~nsq_sansio.connection.ClientConnection` (a part
    of it: the connection's ``__slots__`` hold these fields), and the RDY bound the frame loop
    checks after each run of messages."""

    if not TYPE_CHECKING:  # the fields are in the connection's __slots__ (one layout for all)
        __slots__ = ()

    #: Ids of the messages delivered here and not answered yet.
    _in_flight: set[bytes]
    #: The last RDY sent, and what is left of it after the messages received since.
    _rdy: int
    _rdy_remaining: int
    #: The RDY bound: the RDY nsqd may still be applying, and how many messages may still
    #: come under it after a lower RDY was sent (nsqd reads the new one later).
    _ceiling: int
    _credit: int
    _allowed: int
    #: A message received this long ago (s) may have timed out on nsqd (half its timeout).
    _expiry_window: float
    #: [when, most messages held after a read then]: one entry per 1/32 of the window, so
    #: how many held messages may have timed out is known without a time per message.
    _held_history: deque[list[float]]
    topic: str | None
    channel: str | None
    # The connection's, shared with its other parts.
    _state: ConnectionState
    _out: list[bytes]
    _awaiting: deque[tuple[Awaiting, int]]
    _max_req_timeout: float | None
    _last_received: float | None
    _as: tuple[type, int, object, float, float] | None

    if TYPE_CHECKING:

        @property
        def max_rdy_count(self) -> int: ...
        def _enter(self, event: Lifecycle) -> None: ...
        def _require(self, what: str, states: Iterable[ConnectionState]) -> None: ...

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

    def subscribe(self, topic: str, channel: str) -> None:
        """``SUB``: receive messages of ``topic`` on ``channel`` (after RDY)."""
        self._require("subscribe()", (_S.READY,))
        self._out.append(frames.encode_sub(topic, channel))
        self._awaiting.append((Awaiting.SUB, 0))
        self.topic = topic
        self.channel = channel
        self._enter(Lifecycle.SUB_SENT)

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
        delay_ms = milliseconds("requeue() delay", delay)
        if self._max_req_timeout is not None and delay > self._max_req_timeout:
            raise delay_error("requeue()", delay, self._max_req_timeout, assumed=False)
        self._settle("requeue()", message_id)
        self._out.append(frames.encode_req(message_id, delay_ms))

    def touch(self, message_id: bytes) -> None:
        """``TOUCH``: reset the message's timeout on nsqd (up to its max_msg_timeout)."""
        self._require("touch()", MESSAGE_STATES)
        frames.check_message_id(message_id)
        if message_id not in self._in_flight:
            raise self._not_in_flight("touch()", message_id)
        self._out.append(frames.encode_touch(message_id))

    def _not_in_flight(self, what: str, message_id: bytes) -> LocalProtocolError:
        return LocalProtocolError(
            f"{what}: message {message_id.decode('ascii', 'backslashreplace')} is not in flight "
            "on this connection "
            "(already answered, or never received here)"
        )

    def _settle(self, what: str, message_id: bytes) -> None:
        if self._state is not _S.SUBSCRIBED and self._state is not _S.CLOSING:
            self._require(what, MESSAGE_STATES)
        frames.check_message_id(message_id)
        try:
            self._in_flight.remove(message_id)
        except KeyError:
            raise self._not_in_flight(what, message_id) from None

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
