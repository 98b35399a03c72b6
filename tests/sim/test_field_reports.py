"""Long jobs past msg_timeout, rolling restarts with and without a drain, starvation and the
thundering herd, reproduced in the simulator with the numbers that show the behaviour."""

from __future__ import annotations

from nsq_sansio.testing.scenarios import long_jobs, rolling_restart, starvation, thundering_herd


def test_long_job_without_keepalive_is_redelivered_and_runs_twice_at_once() -> None:
    # a 25 s job with msg_timeout 10 s: nsqd takes it back every 10 s and hands it
    # to another (hungry) handler while the first one still works on it.
    result = long_jobs(25.0, keepalive=False, msg_timeout=10.0, max_msg_timeout=30.0)
    assert result.deliveries >= 3
    assert result.redelivered_at[:2] == (10.0, 20.0)
    assert result.overlapping
    assert result.touches == 0


def test_keepalive_prevents_redelivery_up_to_max_msg_timeout() -> None:
    result = long_jobs(25.0, keepalive=True, msg_timeout=10.0, max_msg_timeout=30.0)
    assert result.deliveries == 1
    assert result.redelivered_at == ()
    assert not result.overlapping
    assert result.touches >= 2  # it had to TOUCH to get past 10 s


def test_keepalive_stops_at_max_msg_timeout() -> None:
    # TOUCH only holds the message until nsqd's --max-msg-timeout
    result = long_jobs(45.0, keepalive=True, msg_timeout=10.0, max_msg_timeout=30.0)
    assert result.redelivered_at[0] == 30.0
    assert result.overlapping


def test_rolling_restart_without_drain_waits_for_timeouts() -> None:
    # killed consumers leave their in-flight messages to nsqd's msg_timeout (10 s)
    results = [rolling_restart(drain=False, consumers=3, seed=seed) for seed in range(3)]
    assert all(r.finished == r.expected == 100 for r in results)
    assert all(r.timeouts > 0 for r in results)
    assert all(r.max_latency >= 10.0 for r in results)


def test_rolling_restart_with_drain_moves_messages_at_once() -> None:
    results = [rolling_restart(drain=True, consumers=3, seed=seed) for seed in range(3)]
    assert all(r.finished == r.expected == 100 for r in results)
    assert all(r.timeouts == 0 for r in results)  # nothing was left to time out
    assert all(r.max_latency < 10.0 for r in results)  # nothing waited for one


def test_more_nsqd_than_max_in_flight_does_not_starve() -> None:
    # 5 nsqd, max_in_flight 2, messages only on nsqd3 and nsqd4: RDY has to move to find them
    for seed in range(3):
        result = starvation(nsqd=5, max_in_flight=2, loaded=(3, 4), messages=40, seed=seed)
        assert result.finished == result.expected == 40
        assert result.per_nsqd == {"nsqd3": 20, "nsqd4": 20}
        assert result.done_at < 30.0


def test_jitter_spreads_lookupd_polls() -> None:
    herd = thundering_herd(consumers=40, jitter=0.0, interval=10.0, window=0.5)
    spread = thundering_herd(consumers=40, jitter=0.3, interval=10.0, window=0.5)
    assert herd.busiest_window == 40  # everyone polls in the same half second, every time
    assert spread.busiest_window <= 15
    assert spread.polls > 0.8 * herd.polls  # the polling rate itself stays about the same


def test_answering_a_delivery_given_up_meanwhile_does_not_raise() -> None:
    # Regression (found by the simulator, fixed in e171e2e): the 25 s job keeps coming back
    # (msg_timeout 10 s); the 4th delivery is given up on the connection where the consumer
    # still works on an older one, which it then finishes. That must be a TakenBack, not a
    # LocalProtocolError (the CLIENT_API invariant).
    result = long_jobs(25.0, keepalive=False, max_attempts=3)
    assert result.deliveries == 4
    assert result.given_up == 1
    assert result.redelivered_at == (10.0, 20.0)


def test_discovery_follows_partitions_and_converges_after_they_heal() -> None:
    from nsq_sansio.testing import ClusterSpec, ConsumerSpec, Simulator

    spec = ClusterSpec(nsqd=3, lookupd=2, consumers=(ConsumerSpec(count=2),))
    sim = Simulator(spec, seed=4)

    def connected(name: str) -> set[str]:
        node = sim.nodes[name]
        return {
            c.address
            for c in node.conn_of.values()  # type: ignore[attr-defined]
            if c.state.name == "OPEN"
        }

    everything = {"nsqd0:4150", "nsqd1:4150", "nsqd2:4150"}
    sim.run_until(20.0)
    assert connected("c0.0") == connected("c0.1") == everything
    cut = sim.net.partition([["nsqd2"], [n for n in sim.nodes if n != "nsqd2"]])
    sim.run_until(80.0)  # heartbeats time out, lookupd forgets nsqd2 (inactive 30 s)
    assert connected("c0.0") == connected("c0.1") == everything - {"nsqd2:4150"}
    sim.net.heal(cut)
    sim.run_until(120.0)  # nsqd2 re-registers, the next polls find it again
    assert connected("c0.0") == connected("c0.1") == everything
    sim.monitor.check_discovery(sim.now)
    sim.raise_if_violated()
