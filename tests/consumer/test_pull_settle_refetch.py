"""Pull mode: fetches that expire and come back faster than a settle time never keep a
lowered RDY's ceiling from settling.

A connection whose RDY was lowered keeps claiming the old RDY (its *ceiling*) for a settle
time: nsqd may still send under it until it reads the lower one. A fetch that expires lowers
every RDY to 0 and the caller's next fetch, in the same step, raises it back: nothing is
written, nsqd still has the RDY it had. That moment used to restart the settle time, so with
fetches shorter than the settle time the ceiling never fell and the connections waiting for
its budget never got RDY: the messages on their nsqd stayed there for good.
"""

from __future__ import annotations

from nsq_sansio.config import Config
from nsq_sansio.consumer import RDY_SETTLE_MIN

from .harness import World

#: Shorter than the settle time (RDY_SETTLE_MIN with bytes that move at once).
EXPIRES = 0.2


def _advance_refetching(w: World, seconds: float, state: dict[str, float]) -> None:
    """As :meth:`World.advance`, with a user that fetches again, in the same step, as soon
    as its fetch expired (as a transport's fetch loop does: the answer, then the next fetch,
    before any byte is written)."""
    c = w.coordinator
    end = w.now + seconds
    while True:
        due = [d for d in w._deadlines() if d <= end]
        if not due:
            break
        w.now = max(w.now, min(due))
        w.deliver_due()
        w._timers()  # a fetch whose expires passed is answered here...
        if w.now >= state["expires_at"] or any(r.request_id == state["request"] for r in w.results):
            state["request"] = c.fetch(10, w.now, expires=EXPIRES)  # ...and the next one
            state["expires_at"] = w.now + EXPIRES
        w.pump()


def test_a_ceiling_settles_while_short_fetches_come_and_go() -> None:
    assert RDY_SETTLE_MIN > EXPIRES
    w = World(2, Config(max_in_flight=10), pull=True)
    w.kill(1)  # nsqd B is down when the consumer starts
    w.start()
    c = w.coordinator
    state = {"request": float(c.fetch(10, w.now, expires=EXPIRES)), "expires_at": EXPIRES}
    w.pump()
    (a,) = c.connection_ids()
    assert w.rdy_by_conn() == {a: 10}  # the whole budget on A, written
    w.revive(1)
    w.publish(1, 5)  # B's messages: only B's RDY can fetch them
    _advance_refetching(w, 3.0, state)  # B reconnects, subscribes, and is raised
    (b,) = [conn_id for conn_id in c.connection_ids() if conn_id != a]
    assert w.server_depth() == 0  # B got RDY: its messages reached the fetches
    delivered = [d for r in w.results for d in r.messages]
    assert [d.conn_id for d in delivered] == [b] * 5
    # Every expiry lowered A's RDY to 0 and the next fetch raised it back in the same step:
    # no RDY 0 reached A's wire. It saw 10, then its share once B came (its ceiling claiming
    # the old 10 for a settle time), then a probe of 1 once B was the one delivering.
    assert [count for conn_id, count in w.rdy_sent if conn_id == a] == [10, 5, 1]
    assert not w.over_budget  # and nsqd never saw more RDY than max_in_flight
