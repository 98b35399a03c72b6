"""RDY decided and RDY written, under the max_in_flight bound (:class:`RdyBound`).

The second layer of :class:`~nsq_sansio.consumer.ConsumerCoordinator`. ``_send_rdy`` decides a
connection's RDY (capped by nsqd's ``max_rdy_count``) and ``_emit_rdy`` hands it to the
connection at the next write, so a step that moves RDY away and back writes nothing, and
:meth:`~RdyBound.pending_data` writes lowered RDYs first: the sum of RDY nsqd sees never
exceeds ``max_in_flight``, not even between two writes. Each connection's *ceiling* bounds
what it may still come to hold after a lowered RDY (see the comment below); the layer above
(:mod:`~nsq_sansio.consumer.distribution`) decides who gets what and gives out budget that
comes back.
"""

from __future__ import annotations

from collections.abc import Iterable

from .actions import Deliver
from .link import Link
from .state import CoordinatorState

__all__ = ["RdyBound"]


class RdyBound(CoordinatorState):
    """RDY writes and the max_in_flight bound (see the module docstring)."""

    # --- output: bytes to write, RDY first -----------------------------------------------------

    def data_to_send(self, conn_id: int) -> bytes:
        """Bytes to write on ``conn_id``."""
        link = self._links.get(conn_id)
        self._dirty.discard(conn_id)
        if link is None or link.proto is None:
            return b""
        self._emit_rdy(link)
        link.dirty = False
        return link.proto.data_to_send()

    def pending_data(self) -> list[tuple[int, bytes]]:
        """``(conn_id, bytes)`` for every connection with something to write, connections
        whose RDY was lowered first (write them in this order)."""
        out: list[tuple[int, bytes]] = []
        dirty = self._dirty
        if not dirty:
            return out
        links = self._links
        order: Iterable[int] = dirty
        if self._rdy_due:
            due = [links[conn_id] for conn_id in self._rdy_due if conn_id in links]
            lowered = [each.conn_id for each in due if each.rdy < each.wire_rdy]
            for each in sorted(due, key=lambda each: each.rdy >= each.wire_rdy):
                self._emit_rdy(each)  # decreases first: the same order as the writes
            self._rdy_due.clear()
            if lowered:
                order = lowered + [conn_id for conn_id in dirty if conn_id not in lowered]
        for conn_id in order:
            link = links.get(conn_id)
            if link is not None and link.proto is not None:
                link.dirty = False
                data = link.proto.data_to_send()
                if data:
                    out.append((conn_id, data))
        dirty.clear()
        return out

    # --- RDY: decided, then written ------------------------------------------------------------

    def _send_rdy(self, link: Link, count: int, now: float) -> None:
        proto = link.proto
        assert proto is not None
        count = max(0, min(count, link.max_rdy))
        if count == 0 and link.rdy == 0:
            return
        if count == link.rdy:
            link.rdy_refresh = True
        self._rdy_due.add(link.conn_id)
        self._dirty.add(link.conn_id)
        if count > link.rdy:
            link.raised_at = now
            if not link.rdy:
                link.rdy_at = now
                if link.share_at <= link.last_message_at or link.share_at <= link.dry_at:
                    link.share_at = now  # delivered or passed on since: a new share
            if count >= link.ceiling and link.conn_id in self._settling:
                self._settled(link)  # its claim is this RDY now: the ceiling no longer counts
        elif count < link.rdy:
            # The settle time runs from the write (_emit_rdy), not from this decision: a
            # step that lowers RDY and raises it back (a fetch that expires, the next one at
            # once) writes nothing, and nsqd still has the RDY written before. Restarting the
            # settle time here kept a ceiling from ever settling when fetches came and went
            # faster than the settle time: its claim held the others' budget at 0 for good.
            link.lowered_at = now
            if link.ceiling > link.wire_rdy and link.conn_id not in self._settling:
                # Raised over its ceiling and lowered again before either was written: the
                # old capacity still counts (writing nothing would not put it back).
                link.settle_at = now + link.settle_delay
                self._settling.add(link.conn_id)
                self._calm = False
        self._total_rdy += count - link.rdy
        link.rdy = count
        link.remaining = count
        self._reclaim(link)

    def _emit_rdy(self, link: Link) -> None:
        """Hand the RDY decided for ``link`` to its connection, unless nsqd has it already."""
        if link.conn_id not in self._rdy_due:
            return
        self._rdy_due.discard(link.conn_id)
        if link.rdy != link.wire_rdy or link.rdy_refresh:
            assert link.proto is not None
            if link.rdy < link.wire_rdy:
                # nsqd may send under the old RDY until it reads this one: that has arrived
                # a settle time after the lowering.
                link.settle_at = link.lowered_at + link.settle_delay
            link.proto.send_ready(link.rdy)
            link.wire_rdy = link.rdy
            if link.rdy >= link.ceiling:
                link.ceiling = link.rdy
                if link.conn_id in self._settling:
                    self._settled(link)  # raised to what it may hold: nothing to settle
            elif link.ceiling > link.rdy and link.conn_id not in self._settling:
                # Lowered: nsqd may still send under the old RDY until it reads this one.
                self._settling.add(link.conn_id)
                self._calm = False
            self._reclaim(link)
        link.rdy_refresh = False

    def _requeue_now(self, link: Link, delivery: Deliver) -> None:
        message_id = delivery.id
        del link.tracked[message_id]
        link.touched.pop(message_id, None)
        link.seen.discard(message_id)
        assert link.proto is not None
        if link.proto.is_in_flight(message_id):
            self._emit_rdy(link)  # drain's RDY 0 goes before the REQ
            link.proto.requeue(message_id, 0.0)
            self._dirty.add(link.conn_id)
            self.requeued += 1

    # --- internals: the max_in_flight bound ----------------------------------------------------
    #
    # nsqd sends on a connection while its in-flight count is below the RDY it last read, so
    # the sum of RDY alone does not bound what the user holds: a lowered RDY leaves what is
    # already in flight there (and what nsqd sent before reading it) in the user's hands. Each
    # connection's *ceiling* bounds what it can still come to hold: raised with each RDY
    # written; after a lowered RDY, one less for every answer written after it (nsqd reads it
    # before those answers, so it can send again only under the new RDY), down to that RDY; and
    # at ``settle_at`` (the old RDY's messages have arrived by then) down to what is held. A
    # raise never takes the sum of ``max(ceiling, RDY)`` over max_in_flight, so the messages
    # held, everywhere, stay within it (not counting those whose deadline passed: nsqd took them
    # back and counts them no more).

    def _reclaim(self, link: Link) -> None:
        """Recount ``link``'s claim after its RDY or ceiling changed."""
        claim = link.ceiling if link.ceiling > link.rdy else link.rdy
        self._claimed += claim - link.claim
        link.claim = claim

    def _budget_left(self, link: Link) -> int:
        """The most RDY ``link`` may have: max_in_flight minus what the others may hold."""
        return self._config.max_in_flight - self._claimed + link.claim

    def _settled(self, link: Link) -> None:
        """``link`` can hold no more than its written RDY again."""
        link.settle_at = None
        self._settling.discard(link.conn_id)
        if not self._settling:
            self._recalm()
