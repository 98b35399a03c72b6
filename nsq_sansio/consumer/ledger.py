"""The RDY ledger (:class:`RdyLedger`): RDY decided, RDY written, and the max_in_flight bound.

Rules:

* Only the ledger writes a connection's RDY fields (``rdy``, ``wire_rdy``, ``ceiling``,
  ``claim``, ``settle_at``) and its own totals (``total``, ``claimed``, ``settling``, ``due``).
* :meth:`~RdyLedger.send` decides an RDY (capped by nsqd's ``max_rdy_count``);
  :meth:`~RdyLedger.emit` hands it to the connection at the next write, and
  :meth:`~RdyLedger.pending_data` writes lowered RDYs first, so the sum of RDY nsqd sees
  never exceeds ``max_in_flight``, not even between two writes.
* A raise never takes ``claimed`` (the sum of each connection's ``max(ceiling, RDY)``) over
  ``max_in_flight``: the messages held, everywhere, stay within it. After a lowered RDY a
  connection is *settling* until answers written after it, or its settle time, bring its
  ceiling down (see the comment in the class).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from .link import Link

__all__ = ["RdyLedger"]


class RdyLedger:
    """RDY writes and the max_in_flight bound (see the module docstring). ``links`` and
    ``dirty`` are the coordinator's (shared, not owned); ``on_settling`` is called when the
    set of settling connections becomes empty or stops being so (the coordinator's hot-path
    flag depends on it)."""

    def __init__(
        self,
        links: dict[int, Link],
        dirty: set[int],
        max_in_flight: int,
        on_settling: Callable[[], None],
    ) -> None:
        self.links = links
        self.dirty = dirty
        #: The bound (the coordinator updates it with set_max_in_flight).
        self.max_in_flight = max_in_flight
        self._on_settling = on_settling
        #: Connections with an RDY decided but not handed to the connection yet; written by
        #: pending_data(), decreases first, so that the sum of RDY nsqd sees never exceeds
        #: max_in_flight, not even between two writes.
        self.due: set[int] = set()
        #: Sum of every connection's decided RDY.
        self.total = 0
        #: Sum of every connection's ``claim`` (max of its RDY and its ceiling): what may end
        #: up held; a raise never takes it over max_in_flight.
        self.claimed = 0
        #: Connections whose ceiling is above their written RDY (a lowered RDY whose old
        #: capacity may still be in use): answers there return budget, so none is calm.
        self.settling: set[int] = set()

    # --- output: bytes to write, RDY first -----------------------------------------------------

    def data_to_send(self, conn_id: int) -> bytes:
        """Bytes to write on ``conn_id``."""
        link = self.links.get(conn_id)
        self.dirty.discard(conn_id)
        if link is None or link.proto is None:
            return b""
        self.emit(link)
        link.dirty = False
        return link.proto.data_to_send()

    def pending_data(self) -> list[tuple[int, bytes]]:
        """``(conn_id, bytes)`` for every connection with something to write, connections
        whose RDY was lowered first (write them in this order)."""
        out: list[tuple[int, bytes]] = []
        dirty = self.dirty
        if not dirty:
            return out
        links = self.links
        order: Iterable[int] = dirty
        if self.due:
            due = [links[conn_id] for conn_id in self.due if conn_id in links]
            lowered = [each.conn_id for each in due if each.rdy < each.wire_rdy]
            for each in sorted(due, key=lambda each: each.rdy >= each.wire_rdy):
                self.emit(each)  # decreases first: the same order as the writes
            self.due.clear()
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

    def send(self, link: Link, count: int, now: float) -> None:
        """Decide ``link``'s RDY (written at the next :meth:`pending_data`)."""
        proto = link.proto
        assert proto is not None
        count = max(0, min(count, link.max_rdy))
        if count == 0 and link.rdy == 0:
            return
        if count == link.rdy:
            link.rdy_refresh = True
        self.due.add(link.conn_id)
        self.dirty.add(link.conn_id)
        if count > link.rdy:
            link.raised_at = now
            if not link.rdy:
                link.rdy_at = now
                if link.share_at <= link.last_message_at or link.share_at <= link.dry_at:
                    link.share_at = now  # delivered or passed on since: a new share
            if count >= link.ceiling and link.conn_id in self.settling:
                self.settled(link)  # its claim is this RDY now: the ceiling no longer counts
        elif count < link.rdy:
            # The settle time runs from the write (emit), not from this decision: a step
            # that lowers RDY and raises it back (a fetch that expires, the next one at once)
            # writes nothing, and nsqd still has the RDY written before. Restarting the
            # settle time here kept a ceiling from ever settling when fetches came and went
            # faster than the settle time: its claim held the others' budget at 0 for good.
            link.lowered_at = now
            if link.ceiling > link.wire_rdy and link.conn_id not in self.settling:
                # Raised over its ceiling and lowered again before either was written: the
                # old capacity still counts (writing nothing would not put it back).
                link.settle_at = now + link.settle_delay
                self._start_settling(link)
        self.total += count - link.rdy
        link.rdy = count
        link.remaining = count
        self.reclaim(link)

    def emit(self, link: Link) -> None:
        """Hand the RDY decided for ``link`` to its connection, unless nsqd has it already."""
        if link.conn_id not in self.due:
            return
        self.due.discard(link.conn_id)
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
                if link.conn_id in self.settling:
                    self.settled(link)  # raised to what it may hold: nothing to settle
            elif link.ceiling > link.rdy and link.conn_id not in self.settling:
                # Lowered: nsqd may still send under the old RDY until it reads this one.
                self._start_settling(link)
            self.reclaim(link)
        link.rdy_refresh = False

    def apply_targets(self, links: list[Link], now: float, *, quarter_steps: bool) -> None:
        """Move every link to its ``target``: lowered ones first, then raises as far as the
        bound allows. With max_in_flight lowered under what may be held, no connection takes
        a new message (RDY 0) until enough is answered; then the shares come back."""
        for link in links:
            if link.rdy > link.target:
                self.send(link, link.target, now)
        if self.claimed > self.max_in_flight:
            for link in links:
                if link.rdy:
                    self.send(link, 0, now)
            return
        self.raise_to_targets(links, now, quarter_steps=quarter_steps)

    def raise_to_targets(self, links: list[Link], now: float, *, quarter_steps: bool) -> None:
        """Raise every link below its target as far as the bound allows. With
        ``quarter_steps`` (push mode) a link that has RDY is raised by at least a quarter of
        its target (or to it), so budget that comes back one answer at a time is not written
        as one RDY per answer."""
        for link in links:
            if link.rdy < link.target:
                count = min(link.target, self.budget_left(link))
                if count <= link.rdy:
                    continue
                if (
                    count < link.target
                    and link.rdy
                    and quarter_steps
                    and (count - link.rdy) * 4 < link.target
                ):
                    continue
                self.send(link, count, now)

    def forget(self, link: Link) -> None:
        """``link``'s connection is gone: its RDY and its claim leave the totals."""
        conn_id = link.conn_id
        self.dirty.discard(conn_id)
        self.due.discard(conn_id)
        self.total -= link.rdy
        self.claimed -= link.claim
        link.rdy = link.target = link.claim = link.ceiling = 0
        if self.settling:
            self.settling.discard(conn_id)
            if not self.settling:
                self._on_settling()

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

    def reclaim(self, link: Link) -> None:
        """Recount ``link``'s claim after its RDY or ceiling changed."""
        claim = link.ceiling if link.ceiling > link.rdy else link.rdy
        self.claimed += claim - link.claim
        link.claim = claim

    def budget_left(self, link: Link) -> int:
        """The most RDY ``link`` may have: max_in_flight minus what the others may hold."""
        return self.max_in_flight - self.claimed + link.claim

    def settled(self, link: Link) -> None:
        """``link`` can hold no more than its written RDY again."""
        link.settle_at = None
        self.settling.discard(link.conn_id)
        if not self.settling:
            self._on_settling()

    def _start_settling(self, link: Link) -> None:
        self.settling.add(link.conn_id)
        if len(self.settling) == 1:
            self._on_settling()

    def answered(self, link: Link, deadlines: Sequence[float], now: float) -> bool:
        """Answers to messages with these ``deadlines`` went out on a settling ``link``, after
        its lowered RDY: nsqd reads them after that RDY, so each frees one slot of the old RDY
        for good. Not so for a message nsqd may have timed out already (its slot was freed then,
        and maybe filled again): those are counted when the ceiling settles. True when budget
        came back (the caller gives it out)."""
        after = now + link.settle_delay
        count = sum(map(after.__lt__, deadlines))
        if not count:
            return False
        if link.ceiling > link.wire_rdy:
            link.ceiling -= min(count, link.ceiling - link.wire_rdy)
        if link.ceiling <= link.wire_rdy:
            self.settled(link)
        self.reclaim(link)
        return True

    def settle_due(self, now: float) -> bool:
        """Release the ceilings whose settle time came: what nsqd sent under an old RDY has
        arrived, so the ceiling falls to the RDY, or to the messages still held (unexpired).
        True when budget came back."""
        released = False
        for conn_id in list(self.settling):
            link = self.links[conn_id]
            if link.settle_at is None or now < link.settle_at:
                continue
            live, expiry = link.live_count(now)
            ceiling = max(link.wire_rdy, live)
            released = released or ceiling < link.ceiling
            link.ceiling = ceiling
            if ceiling > link.wire_rdy:
                link.settle_at = expiry  # the user holds more than the RDY: wait for answers
            else:
                self.settled(link)
            self.reclaim(link)
        return released

    def next_settle(self) -> float | None:
        """The soonest settle time of a settling connection."""
        best: float | None = None
        for conn_id in self.settling:
            settle_at = self.links[conn_id].settle_at
            if settle_at is not None and (best is None or settle_at < best):
                best = settle_at
        return best

    def take_late(self, link: Link, arriving: int, now: float, *, may_grow: bool) -> bool:
        """``arriving`` more messages on ``link`` than its claim covers: nsqd sent them under
        an RDY it had not read as lowered when the settle time released that capacity (a
        partition held the bytes longer). True when they fit anyway (the ceiling grows into
        budget nobody claims, when ``may_grow``: the consumer runs); False: what does not fit
        must be handed back.

        A held message near its deadline (less than a settle time ahead: nsqd's deadline runs
        from its send, before ours) may already be taken back by nsqd, which may fill its slot:
        handing that message back would have nsqd send it again, again and again. So what
        arrives is taken when it fits the claim without the messages nsqd may have timed out,
        and the RDY written, which nsqd may be using, covers it. Beyond that RDY nsqd sent under
        an older, higher one (a partition held the lower one back), and the messages near their
        deadline count: nsqd may not have timed them out yet."""
        live = link.live_count(now)[0] + arriving
        if live <= link.claim:
            return True
        if link.live_count(now + link.settle_delay)[0] + arriving <= link.wire_rdy:
            return True  # into slots nsqd's timeouts freed, under the RDY it has
        excess = live - link.claim
        if not may_grow or self.claimed + excess > self.max_in_flight:
            return False
        link.ceiling = live
        self.reclaim(link)
        if link.ceiling > link.wire_rdy and link.conn_id not in self.settling:
            link.settle_at = now + link.settle_delay
            self._start_settling(link)
        return True
