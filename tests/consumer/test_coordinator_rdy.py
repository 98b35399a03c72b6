"""RDY rules of the coordinator, with explicit times, against the real nsqd server role."""

from __future__ import annotations

import pytest

from nsq_sansio.config import Config
from nsq_sansio.consumer import RDY_SETTLE_MIN, Deliver
from nsq_sansio.errors import ConfigError

from .harness import World


def test_new_connections_start_at_one_then_spread_evenly() -> None:
    w = World(3, Config(max_in_flight=10))
    w.start()
    assert sorted(w.rdy_by_conn().values()) == [1, 1, 1]
    for node in range(3):
        w.publish(node)
    # The first warm connection got RDY 8 and gives most of it up: the others get it once that
    # settles (nsqd may have sent under RDY 8 before reading the lowered RDY).
    w.advance(1.0)
    assert sorted(w.rdy_by_conn().values()) == [3, 3, 4]  # 10 // 3, remainder given out
    assert w.coordinator.total_rdy == 10


def test_sum_of_rdy_never_exceeds_max_in_flight_while_connections_come_and_go() -> None:
    w = World(4, Config(max_in_flight=7))
    w.start()
    for node in range(4):
        w.publish(node, 3)
    assert w.coordinator.total_rdy <= 7
    w.kill(2)
    assert w.coordinator.total_rdy <= 7
    assert sum(w.rdy_by_conn().values()) == w.coordinator.total_rdy
    w.finish_all()
    w.revive(2)
    w.advance(120)
    assert len(w.coordinator.connection_ids()) == 4
    assert w.coordinator.total_rdy <= 7


def test_server_max_rdy_count_caps_each_connection() -> None:
    w = World(1, Config(max_in_flight=100), node_options={"max_rdy_count": 3})
    w.start()
    w.publish(0, 10)
    assert w.rdy_by_conn() == {1: 3}
    assert max(n for _, n in w.rdy_sent) <= 3


def test_rdy_is_refreshed_below_a_quarter_not_on_every_message() -> None:
    w = World(1, Config(max_in_flight=100))
    w.start()
    w.publish(0)  # warms up: RDY 100
    sent_before = len(w.rdy_sent)
    assert w.rdy_sent[-1] == (1, 100)
    w.publish(0, 74)  # remaining 100 -> 26 (>= 25%): nothing re-sent
    assert len(w.rdy_sent) == sent_before
    w.publish(0, 2)  # remaining 24 < 25: RDY re-sent once
    assert w.rdy_sent[sent_before:] == [(1, 100)]


def test_fewer_rdy_than_connections_rotates_to_serve_every_nsqd() -> None:
    config = Config(max_in_flight=1, low_rdy_idle_timeout=10.0, rdy_redistribute_interval=5.0)
    w = World(3, config, seed=3)
    w.start()
    rdy = w.rdy_by_conn()
    assert sum(rdy.values()) == 1
    holder = next(c for c, n in rdy.items() if n)
    # Only an nsqd that does not hold the RDY has messages.
    target = next(i for i, a in enumerate(w.addresses) if a != w.coordinator._links[holder].address)
    w.publish(target, 1)
    assert not w.inbox
    w.advance(60.0)
    assert len(w.inbox) == 1, "RDY must eventually move to the nsqd with messages"
    assert w.coordinator.total_rdy <= 1


def test_is_starved_follows_the_guide() -> None:
    w = World(1, Config(max_in_flight=10))
    w.start()
    w.publish(0, 8)  # warm-up: RDY 10, 8 in flight < 8.5
    assert w.coordinator.total_rdy == 10
    assert not w.coordinator.is_starved()
    w.publish(0, 1)  # 9 >= 8.5
    assert w.coordinator.is_starved()
    w.finish_all()
    assert not w.coordinator.is_starved()


def test_set_max_in_flight_zero_pauses_and_back_resumes_at_once() -> None:
    w = World(2, Config(max_in_flight=10))
    w.start()
    w.publish(0)
    w.publish(1)
    w.finish_all()
    w.coordinator.set_max_in_flight(0, w.now)
    w.pump()
    assert w.rdy_by_conn() == {1: 0, 2: 0}
    w.publish(0, 3)
    assert not w.inbox  # paused: nsqd keeps them
    w.advance(1.0)  # paused for a while (what the RDY 0 stopped has settled)
    w.coordinator.set_max_in_flight(4, w.now)
    w.pump()
    assert sorted(w.rdy_by_conn().values()) == [2, 2]
    assert len(w.inbox) == 2  # node 0 holds RDY 2
    with pytest.raises(ConfigError, match="max_in_flight"):
        w.coordinator.set_max_in_flight(-1, w.now)


def test_new_connection_lowers_existing_ones_first() -> None:
    w = World(2, Config(max_in_flight=2), direct=True)
    w.kill(1)
    w.start()
    w.publish(0)  # conn to node 0 warms up to RDY 2
    assert w.coordinator.total_rdy == 2
    w.revive(1)
    w.advance(5.0)  # reconnect happens
    assert len(w.coordinator.connection_ids()) == 2
    assert w.coordinator.total_rdy <= 2
    assert sorted(w.rdy_by_conn().values()) == [1, 1]


def _deliveries(w: World) -> list[Deliver]:
    return list(w.inbox)


def test_busy_holder_gives_rdy_up_after_low_rdy_timeout() -> None:
    config = Config(
        max_in_flight=1,
        low_rdy_idle_timeout=10.0,
        low_rdy_timeout=30.0,
        rdy_redistribute_interval=5.0,
    )
    w = World(2, config, seed=1)
    w.start()
    w.publish(0, 200)
    w.publish(1, 200)
    served: set[int] = set()
    for _ in range(80):  # a steady stream: the holder never goes idle
        w.advance(1.0)
        for d in list(w.inbox):
            served.add(d.conn_id)
            w.coordinator.finish(d, w.now)
        w.inbox.clear()
        w.pump()
        assert w.coordinator.total_rdy <= 1
    assert served == {1, 2}, "both nsqd must be served in turn"


def test_lowered_connections_are_written_before_raised_ones() -> None:
    # Each rotation moves RDY 1 from one connection to the other: RDY 0 on the holder must reach
    # the wire before RDY 1 on the other, or nsqd briefly sees 2 over max_in_flight 1.
    config = Config(max_in_flight=1, low_rdy_idle_timeout=10.0, rdy_redistribute_interval=5.0)
    w = World(2, config)
    w.start()
    assert w.rdy_by_conn() == {1: 1, 2: 0}
    w.advance(10.0)
    # RDY 0 on 1 at once; RDY 1 on 2 once what nsqd may have sent on 1 before reading its
    # RDY 0 has arrived (RDY_SETTLE_MIN later).
    assert w.rdy_by_conn() == {1: 0, 2: 0}
    w.advance(RDY_SETTLE_MIN)
    assert w.rdy_by_conn() == {1: 0, 2: 1}
    w.advance(15.0)  # 2 got its RDY at 10.25: idle for 10 s at the tick of 25, settled at 25.25
    assert w.rdy_by_conn() == {1: 1, 2: 0}
    assert w.over_budget == []
