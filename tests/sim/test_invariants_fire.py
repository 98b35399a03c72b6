"""The invariants can fail: each test breaks one rule on purpose (a mutant of the consumer or
of nsqd) and checks the simulator catches it, next to a control run that passes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from nsq_sansio.backoff import Backoff
from nsq_sansio.config import Config
from nsq_sansio.consumer import ConsumerCoordinator
from nsq_sansio.consumer.ledger import RdyLedger
from nsq_sansio.discovery import LookupdPoller
from nsq_sansio.server.channel import Channel
from nsq_sansio.server.protocol_v2 import ProtocolV2
from nsq_sansio.testing import (
    ClusterSpec,
    ConsumerSpec,
    Fault,
    FaultKind,
    Handler,
    Invariant,
    InvariantViolation,
    Scenario,
    Workload,
    run_scenario,
)

CONFIG = ConsumerSpec().config


def scenario(
    *,
    nsqd: int = 2,
    config: Config = CONFIG,
    handler: Handler | None = None,
    count: int = 2,
    faults: tuple[Fault, ...] = (),
    messages: int = 200,
    seed: int = 11,
) -> Scenario:
    consumers = (ConsumerSpec(count=count, config=config, handler=handler or Handler()),)
    return Scenario(
        cluster=ClusterSpec(nsqd=nsqd, consumers=consumers),
        workload=Workload(messages=messages, rate=200.0),
        faults=faults,
        seed=seed,
    )


def caught(scn: Scenario) -> set[Invariant]:
    with pytest.raises(InvariantViolation) as info:
        run_scenario(scn)
    assert "python -m nsq_sansio.testing replay " in str(info.value)
    return {v.invariant for v in info.value.violations}


def test_rdy_over_max_in_flight_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    scn = scenario(config=CONFIG.replace(max_in_flight=4))
    run_scenario(scn)  # control: the real rule holds
    original = RdyLedger.send

    def off_by_one(self: RdyLedger, link: Any, count: int, now: float) -> None:
        original(self, link, count + 1 if count > 1 else count, now)

    monkeypatch.setattr(RdyLedger, "send", off_by_one)
    assert Invariant.RDY_SUM in caught(scn)


def test_holding_more_than_max_in_flight_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Slow handlers hold messages while nsqd1 stops and comes back (the consumer reconnects:
    # a connection joins while the user holds its max_in_flight). The mutant is the rule
    # before issue 12.2: only the sum of RDY counts, not what is in flight elsewhere.
    faults = (Fault(2.0, FaultKind.STOP, "nsqd1", 3.0),)
    scn = scenario(
        config=CONFIG.replace(max_in_flight=8),
        handler=Handler(duration=0.4),
        faults=faults,
        messages=300,
    )
    run_scenario(scn)

    def rdy_only(self: RdyLedger, link: Any) -> None:
        self.claimed += link.rdy - link.claim
        link.claim = link.rdy

    monkeypatch.setattr(RdyLedger, "reclaim", rdy_only)
    assert Invariant.HELD in caught(scn)


def test_rdy_above_one_while_backing_off_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    scn = scenario(
        config=CONFIG.replace(max_in_flight=8), handler=Handler(duration=0.01, failure_rate=0.3)
    )
    run_scenario(scn)

    def ignore_backoff(self: Backoff, max_in_flight: int) -> int:
        return max_in_flight

    monkeypatch.setattr(Backoff, "rdy_budget", ignore_backoff)
    assert Invariant.BACKOFF_RDY in caught(scn)


def test_nsqd_pushing_past_rdy_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    scn = scenario(config=CONFIG.replace(max_in_flight=3), handler=Handler(duration=0.2))
    run_scenario(scn)
    original = ProtocolV2._cmd_rdy

    def generous(self: ProtocolV2, conn: Any, params: list[bytes], now: float, events: Any) -> None:
        original(self, conn, params, now, events)
        if conn.ready_count:
            conn.ready_count += 2  # nsqd believes the client asked for more
            channel = conn.channel
            if channel is not None:
                channel.enqueue_ready(conn)
                channel.pump(now)

    monkeypatch.setattr(ProtocolV2, "_cmd_rdy", generous)
    assert Invariant.RDY_IN_FLIGHT in caught(scn)


def test_a_broker_losing_requeued_messages_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    scn = scenario(handler=Handler(duration=0.01, failure_rate=0.2, backoff=False))
    run_scenario(scn)

    def req_is_fin(
        self: ProtocolV2, conn: Any, params: list[bytes], now: float, events: Any
    ) -> None:
        self._cmd_fin(conn, params[:2], now, events)

    monkeypatch.setattr(ProtocolV2, "_cmd_req", req_is_fin)
    assert Invariant.AT_LEAST_ONCE in caught(scn)


def test_a_drain_that_just_closes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    faults = (Fault(2.0, FaultKind.DRAIN_CONSUMER, "c0.0", 1.0),)
    scn = scenario(
        handler=Handler(duration=0.3, concurrency=1),
        config=CONFIG.replace(max_in_flight=5),
        faults=faults,
    )
    run_scenario(scn)

    def hasty_drain(self: ConsumerCoordinator, now: float, timeout: float | None = None) -> None:
        for link in list(self._links.values()):
            self._connections.drop(link, None, now, close=True)

    monkeypatch.setattr(ConsumerCoordinator, "drain", hasty_drain)
    assert Invariant.DRAIN in caught(scn)


def test_discovery_that_stops_polling_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    faults = (Fault(3.0, FaultKind.CRASH, "nsqd1", 2.0),)
    scn = dataclasses.replace(scenario(faults=faults, messages=20), settle=60.0)
    run_scenario(scn)

    def never(self: LookupdPoller, now: float) -> tuple[list[Any], list[Any]]:
        return [], []

    monkeypatch.setattr(LookupdPoller, "poll_due", never)
    assert Invariant.DISCOVERY in caught(scn)


def test_spec_is_what_the_control_runs_use() -> None:
    # the mutants above are only meaningful if the control scenario really has the shape
    scn = scenario()
    assert scn.cluster.nsqd == 2 and scn.cluster.consumers[0].count == 2
    result = run_scenario(dataclasses.replace(scn, seed=12))
    assert result.messages_expected == 200
    assert result.messages_finished == 200


def test_nsqd_forgetting_attempts_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    scn = scenario(handler=Handler(duration=0.01, failure_rate=0.3, backoff=False))
    run_scenario(scn)
    original = Channel._deliver

    def amnesiac(self: Channel[Any], conn: Any, msg: Any, now: float) -> None:
        msg.attempts = 0  # every delivery looks like the first: max_attempts never triggers
        original(self, conn, msg, now)

    monkeypatch.setattr(Channel, "_deliver", amnesiac)
    assert Invariant.ATTEMPTS in caught(scn)


# Regression: the consumer used to write an RDY increase before the decrease that paid for
# it (pending_data() walked a set); found with rdy_per_write=True.
def test_rdy_sum_holds_after_every_single_write() -> None:
    from nsq_sansio.testing import Simulator

    spec = ClusterSpec(nsqd=3, consumers=(ConsumerSpec(count=2),))
    for seed in range(5):
        sim = Simulator(spec, seed=seed, rdy_per_write=True)
        sim.schedule_workload(Workload(messages=300))
        sim.run_until(20.0)


# Regression: pull mode wrote a new holder's RDY 1 before the old holder's RDY 0 (fixed in
# 93b1edd); found with rdy_per_write=True.
def test_pull_rdy_sum_holds_after_every_single_write() -> None:
    from nsq_sansio.testing import LinkSpec, Simulator

    config = CONFIG.replace(
        max_in_flight=1, low_rdy_idle_timeout=1.0, rdy_redistribute_interval=0.5
    )
    consumer = ConsumerSpec(config=config, use_lookupd=False, pull=True, fetch_batch=1)
    spec = ClusterSpec(nsqd=5, consumers=(consumer,), link=LinkSpec(latency=0.05, jitter=0.0))
    sim = Simulator(spec, seed=0, rdy_per_write=True)
    sim.run_until(20.0)
