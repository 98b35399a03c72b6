"""A client connection's publishing: PUB, MPUB and DPUB queued with their request ids, and
consecutive PUBs to one topic coalesced into one MPUB.

Rules:

* Every publish gets the next request id; nsqd answers commands in order, so the answer at
  the head of the queue of awaited answers is this request's (:class:`Awaiting`).
* A coalesced MPUB is one awaited answer for consecutive request ids: its first id keys its
  size, and its answer (or refusal) is one event per id.
* A PUB joins the one queued just before it only while that one is not yet taken by
  ``data_to_send()``, to the same topic, and within :data:`COALESCE_BYTES` of bodies.
* Delays are seconds on the API and whole milliseconds on the wire, within what a signed
  32-bit value holds; DPUB's is also within nsqd's ``--max-req-timeout``.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from . import frames
from ._connection_lifecycle import PUBLISH_STATES, Awaiting, ConnectionState
from .errors import DelayOutOfRange, LocalProtocolError

__all__ = [
    "COALESCE_BYTES",
    "DEFAULT_MAX_REQ_TIMEOUT",
    "MAX_COMMAND_DELAY",
    "MAX_DELAY_MS",
    "Publishing",
    "check_deferred_delay",
    "delay_error",
    "milliseconds",
]

_S = ConnectionState
_SIZE = struct.Struct(">I")
#: Topics whose PUB header a connection keeps (a producer usually has a handful).
_PUB_HEADERS_KEPT = 256
_MAX_BODY = 0x7FFFFFFF  # what a frame's size field can say (frames checks the same)
_PUBLISH_AWAITING = Awaiting.PUBLISH
_GROUP_AWAITING = Awaiting.PUBLISH_GROUP
#: PUBs coalesced into one MPUB carry at most this many bytes of bodies together (far below
#: nsqd's default ``--max-body-size`` of 5 MiB, and a write's worth on a busy connection).
COALESCE_BYTES = 256 * 1024
#: nsqd's default ``--max-req-timeout`` (seconds), assumed for DPUB when nsqd's own is not known
#: (nsqd does not announce it in its IDENTIFY answer).
DEFAULT_MAX_REQ_TIMEOUT = 3600.0
#: Longest delay a command may carry (ms): what a signed 32-bit value holds, ~24.8 days.
MAX_DELAY_MS = 2**31 - 1
#: The same in seconds, for callers that clamp before asking.
MAX_COMMAND_DELAY = MAX_DELAY_MS / 1000


class Publishing:
    """The publishing commands of :class:`~nsq_sansio.connection.ClientConnection` (a part of
    it: the connection's ``__slots__`` hold these fields)."""

    if not TYPE_CHECKING:  # the fields are in the connection's __slots__ (one layout for all)
        __slots__ = ()

    #: ``PUB <topic>\n`` per topic already validated (the hot path of one-message PUB).
    _pub_headers: dict[str, bytes]
    #: The last command queued, when it is a PUB others may still join (not written yet):
    #: (topic, its awaiting entry, its index in ``_out``, its body).
    _tail_pub: tuple[str, tuple[Awaiting, int], int, bytes] | None
    #: The PUBs coalesced so far with that one (None: it is alone).
    _group: list[bytes] | None
    _group_bytes: int
    #: How many request ids each coalesced MPUB answers, by its first id.
    _group_sizes: dict[int, int]
    _next_request_id: int
    # The connection's, shared with its other parts.
    _state: ConnectionState
    _out: list[bytes]
    _awaiting: deque[tuple[Awaiting, int]]
    _max_req_timeout: float | None

    if TYPE_CHECKING:

        def _require(self, what: str, states: Iterable[ConnectionState]) -> None: ...

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
        if state is not _S.READY and state not in PUBLISH_STATES:  # READY: no enum hash
            self._require("publish()", PUBLISH_STATES)
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
        self._require("multi_publish()", PUBLISH_STATES)
        return self._request(frames.encode_mpub(topic, bodies))

    def deferred_publish(self, topic: str, body: bytes, delay: float) -> int:
        """``DPUB``: deliverable after ``delay`` seconds; returns the request id.

        A delay above nsqd's ``max_req_timeout`` (:attr:`max_req_timeout`, or nsqd's default
        of an hour when it is not known) raises :class:`~nsq_sansio.errors.DelayOutOfRange`:
        nsqd would refuse it with a fatal ``E_INVALID`` and close the connection."""
        self._require("deferred_publish()", PUBLISH_STATES)
        delay_ms = milliseconds("deferred_publish() delay", delay)
        check_deferred_delay(delay, self._max_req_timeout)
        return self._request(frames.encode_dpub(topic, delay_ms, body))

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

    def _request(self, command: bytes) -> int:
        request_id = self._next_request_id
        self._next_request_id = request_id + 1
        self._out.append(command)
        self._awaiting.append((Awaiting.PUBLISH, request_id))
        return request_id


def check_deferred_delay(delay: float, max_req_timeout: float | None = None) -> None:
    """Raise :class:`~nsq_sansio.errors.DelayOutOfRange` for a DPUB delay (seconds) above
    nsqd's ``max_req_timeout``, or above nsqd's default of an hour when it is not given: nsqd
    refuses it (a fatal ``E_INVALID`` over TCP, ``400 INVALID_DEFER`` over HTTP). For
    publishers without a :class:`ClientConnection`, such as nsqd's HTTP ``/pub?defer=``."""
    limit = DEFAULT_MAX_REQ_TIMEOUT if max_req_timeout is None else max_req_timeout
    if delay > limit:
        raise delay_error("deferred_publish()", delay, limit, assumed=max_req_timeout is None)


def delay_error(what: str, delay: float, limit: float, *, assumed: bool) -> DelayOutOfRange:
    """The error for a delay above nsqd's ``--max-req-timeout`` (``assumed``: its default)."""
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


def milliseconds(what: str, seconds: float) -> int:
    """Seconds to whole milliseconds, refusing negative, NaN, infinite and absurd values."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise LocalProtocolError(f"{what} must be a number of seconds, got {seconds!r}")
    if not 0 <= seconds <= MAX_DELAY_MS / 1000:
        raise LocalProtocolError(
            f"{what} must be within 0..{MAX_DELAY_MS / 1000:.0f} seconds, got {seconds!r}"
        )
    return round(seconds * 1000)
