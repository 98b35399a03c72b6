"""Pull mode's queue of fetches (after JetStream's pull consumers), pure.

``fetch(batch, expires, no_wait)`` registers a :class:`FetchRequest`; the coordinator keeps the
RDY of its connections equal to what they hold plus their share of the requests' remaining
counts, so nsqd never pushes more than was asked. Messages go to the oldest waiting request;
one that arrives for no waiting request (a race with a lowered RDY) is held in a short buffer
(``pull_hold_timeout``) for the next fetch and then requeued, never kept until it times out.
Nobody TOUCHes what a waiting request has gathered (the user does not have it yet), so a
request answers early (``AGED``) once the oldest message it gathered has used half of its
msg_timeout: waiting on would let nsqd take it back and deliver it again.
A ``no_wait`` fetch answers at once with what is buffered, possibly nothing (reason
``NO_MESSAGES``, not an error). Waiting requests are bounded (``max_waiting_fetches``).
This module is the queue itself (:class:`FetchQueue`); the coordinator's side of pull mode is
:mod:`nsq_sansio.consumer.pull`, its shares :func:`nsq_sansio.consumer.shares.pull_shares`.
"""

from __future__ import annotations

import heapq
from collections import deque

from .actions import Deliver

__all__ = ["FetchQueue", "FetchRequest"]


class FetchRequest:
    """One waiting fetch (internal, mutable)."""

    __slots__ = ("batch", "expires_at", "messages", "remaining", "request_id")

    def __init__(self, request_id: int, batch: int, expires_at: float | None) -> None:
        self.request_id = request_id
        self.batch = batch
        self.remaining = batch
        self.expires_at = expires_at
        self.messages: list[Deliver] = []


def _half_life(delivery: Deliver) -> float:
    """When a message has used half of its msg_timeout (nsqd takes it back at ``deadline``)."""
    return delivery.received_at + (delivery.deadline - delivery.received_at) / 2


def _aged_at(request: FetchRequest) -> float | None:
    """When the oldest message a request gathered has used half of its msg_timeout."""
    if not request.messages:
        return None
    return min(map(_half_life, request.messages))


class FetchQueue:
    """Waiting fetches (FIFO), their expiries, and the hold buffer; tracks ``outstanding``."""

    __slots__ = ("_expiries", "buffer", "outstanding", "waiting")

    def __init__(self) -> None:
        self.waiting: deque[FetchRequest] = deque()
        self._expiries: list[tuple[float, int]] = []
        #: Messages that arrived for no request: (hold deadline, delivery).
        self.buffer: deque[tuple[float, Deliver]] = deque()
        #: Sum of ``remaining`` over waiting requests.
        self.outstanding = 0

    def add(self, request: FetchRequest) -> None:
        self.waiting.append(request)
        self.outstanding += request.remaining
        if request.expires_at is not None:
            heapq.heappush(self._expiries, (request.expires_at, request.request_id))
        aged_at = _aged_at(request)
        if aged_at is not None:
            heapq.heappush(self._expiries, (aged_at, request.request_id))

    def give_many(self, deliveries: list[Deliver]) -> tuple[list[FetchRequest], int]:
        """Hand messages, in order, to the waiting requests, oldest first (a slice per
        request; a request ages from its first message): returns the requests that filled,
        and how many messages were given (the rest found no waiting request)."""
        waiting = self.waiting
        filled: list[FetchRequest] = []
        count = len(deliveries)
        given = 0
        while given < count and waiting:
            request = waiting[0]
            take = min(request.remaining, count - given)
            first = not request.messages
            if take == count:
                request.messages += deliveries
            else:
                request.messages += deliveries[given : given + take]
            request.remaining -= take
            self.outstanding -= take
            if request.remaining <= 0:
                waiting.popleft()
                filled.append(request)
            elif first:  # its oldest message: the request ages from here
                aged_at = _half_life(deliveries[given])
                heapq.heappush(self._expiries, (aged_at, request.request_id))
            given += take
        return filled, given

    def remove(self, request: FetchRequest) -> None:
        self.waiting.remove(request)
        self.outstanding -= request.remaining

    def take_all(self) -> list[FetchRequest]:
        """Remove and return every waiting request (drain)."""
        requests = list(self.waiting)
        self.waiting.clear()
        self._expiries.clear()
        self.outstanding = 0
        return requests

    def expired(self, now: float) -> list[FetchRequest]:
        """Remove and return the requests whose ``expires`` passed, and those whose oldest
        gathered message has used half of its msg_timeout (``AGED``: their ``expires_at`` is
        still ahead)."""
        done: list[FetchRequest] = []
        while self._expiries and self._expiries[0][0] <= now:
            _, request_id = heapq.heappop(self._expiries)
            for request in self.waiting:
                if request.request_id == request_id:
                    break
            else:
                continue  # answered already
            if request.expires_at is None or request.expires_at > now:
                aged_at = _aged_at(request)  # messages may have gone with their connection
                if aged_at is None:
                    continue  # nothing gathered any more: wait for ``expires``
                if aged_at > now:
                    heapq.heappush(self._expiries, (aged_at, request_id))
                    continue
            self.remove(request)
            done.append(request)
        return done

    def next_deadline(self) -> float | None:
        best: float | None = None
        while self._expiries:
            expires_at, request_id = self._expiries[0]
            if any(r.request_id == request_id for r in self.waiting):
                best = expires_at
                break
            heapq.heappop(self._expiries)  # already answered
        if self.buffer and (best is None or self.buffer[0][0] < best):
            best = self.buffer[0][0]
        return best
