"""Runs are deterministic and replayable from the one printed line."""

from __future__ import annotations

import pytest

from nsq_sansio.testing import (
    ClusterSpec,
    ConsumerSpec,
    Fault,
    FaultKind,
    Handler,
    InvariantViolation,
    LinkSpec,
    Scenario,
    Workload,
    replay_line,
    run_scenario,
    scenario_blob,
    scenario_from_blob,
)
from nsq_sansio.testing.__main__ import main

SCENARIO = Scenario(
    cluster=ClusterSpec(
        nsqd=3,
        lookupd=2,
        durable=False,
        link=LinkSpec(latency=0.002, jitter=0.01),
        consumers=(
            ConsumerSpec(count=2, handler=Handler(duration=0.05, failure_rate=0.2)),
            ConsumerSpec(count=1, channel="audit", use_lookupd=False),
        ),
    ),
    workload=Workload(messages=150, rate=100.0, batch=5),
    faults=(
        Fault(1.5, FaultKind.PARTITION, "nsqd1", 3.0),
        Fault(2.0, FaultKind.CRASH, "nsqd2", 4.0),
        Fault(2.5, FaultKind.KILL_CONSUMER, "c0.1", 1.0),
    ),
    seed=1234,
)


def test_blob_round_trips() -> None:
    assert scenario_from_blob(scenario_blob(SCENARIO)) == SCENARIO
    assert replay_line(SCENARIO).startswith("python -m nsq_sansio.testing replay ")


def test_same_scenario_same_run() -> None:
    first = run_scenario(SCENARIO)
    second = run_scenario(scenario_from_blob(scenario_blob(SCENARIO)))
    assert (first.events, first.deliveries, first.end_time) == (
        second.events,
        second.deliveries,
        second.end_time,
    )
    assert first.monitor.finished == second.monitor.finished
    assert first.monitor.excused == second.monitor.excused
    # and the seed matters
    runs = [
        run_scenario(
            Scenario(
                cluster=SCENARIO.cluster,
                workload=SCENARIO.workload,
                faults=SCENARIO.faults,
                seed=seed,
            )
        )
        for seed in (99, 100, 101)
    ]
    signatures = {(r.events, r.deliveries, r.end_time, r.monitor.messages_sent) for r in runs}
    signatures.add((first.events, first.deliveries, first.end_time, first.monitor.messages_sent))
    assert len(signatures) > 1  # other seeds make other runs


def test_crash_without_durability_excuses_only_what_the_broker_held() -> None:
    result = run_scenario(SCENARIO)
    monitor = result.monitor
    assert all(monitor.expected[key] == "nsqd2" for key in monitor.excused)
    assert result.messages_finished + len(monitor.excused) == result.messages_expected


def test_replay_command_runs_the_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", scenario_blob(SCENARIO)]) == 0
    assert "ok:" in capsys.readouterr().out
    assert main(["replay", scenario_blob(Scenario(seed=3)), "--rdy-per-step"]) == 0
    assert main(["nonsense"]) == 2


def test_replay_command_help_and_bad_blobs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--help"]) == 0
    assert main(["-h"]) == 0
    assert "usage: python -m nsq_sansio.testing replay <blob>" in capsys.readouterr().out
    for bad in ("garbage", "eNq1VE1v2zAM", scenario_blob(SCENARIO)[:-8]):
        assert main(["replay", bad]) == 2
        assert "not a replay blob" in capsys.readouterr().err


def test_violation_message_carries_the_replay_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from nsq_sansio.consumer.ledger import RdyLedger

    original = RdyLedger.send

    def greedy(self: RdyLedger, link: object, count: int, now: float) -> None:
        original(self, link, count * 2, now)  # type: ignore[arg-type]

    monkeypatch.setattr(RdyLedger, "send", greedy)
    with pytest.raises(InvariantViolation) as info:
        run_scenario(SCENARIO)
    line = str(info.value).splitlines()[-1]
    assert line == "replay: " + replay_line(SCENARIO)
    assert main(["replay", scenario_blob(SCENARIO)]) == 1


def test_crash_excuses_per_channel_copy() -> None:
    # Regression: a message in flight on one channel of a crashed durable nsqd is lost for that
    # channel even though the other channel's copy is still on disk.
    from nsq_sansio.testing import Simulator

    spec = ClusterSpec(
        nsqd=1,
        consumers=(
            ConsumerSpec(count=1, handler=Handler(duration=5.0)),
            ConsumerSpec(count=1, channel="audit", handler=Handler(duration=0.01), start_at=60.0),
        ),
    )
    sim = Simulator(spec, seed=3)
    sim.schedule_workload(Workload(messages=1, via_tcp=False))
    sim.run_until(3.0)  # archive holds m0 in flight; audit has it on disk
    sim.nsqds[0].crash(sim.now)
    assert ("events", "archive", b"m0") in sim.monitor.excused
    assert ("events", "audit", b"m0") not in sim.monitor.excused
    sim.heal_all()
    assert sim.settle(300.0)
    assert ("events", "audit", b"m0") in sim.monitor.finished


def test_a_cluster_works_when_every_frame_arrives_in_pieces() -> None:
    # every parser (client, nsqd, lookupd V1 and HTTP, the wire observers) sees cut frames
    cluster = ClusterSpec(
        nsqd=2,
        link=LinkSpec(latency=0.001, jitter=0.001, segment=3),
        consumers=(ConsumerSpec(count=2),),
    )
    result = run_scenario(
        Scenario(
            cluster=cluster,
            workload=Workload(messages=100, batch=5),
            faults=(Fault(2.0, FaultKind.CRASH, "nsqd1", 2.0),),
            seed=8,
        )
    )
    assert result.messages_finished + len(result.monitor.excused) == result.messages_expected
    assert result.messages_finished > 0


def test_big_bodies_go_through_nsqd_output_back_pressure() -> None:
    # 200 KB bodies, RDY up to 50: nsqd's per-connection output high-water mark (64 KiB) holds
    # deliveries back until the consumer's node takes the output; nothing may get stuck
    config = ConsumerSpec().config.replace(max_in_flight=50)
    cluster = ClusterSpec(
        nsqd=2,
        consumers=(ConsumerSpec(count=2, config=config),),
        link=LinkSpec(latency=0.001, jitter=0.0, bandwidth=5e7, segment=1460),
    )
    workload = Workload(messages=120, rate=1000.0, batch=10, body_size=200_000)
    result = run_scenario(Scenario(cluster=cluster, workload=workload, seed=2))
    assert result.messages_finished == result.messages_expected == 120
    assert all(len(key[2]) == 200_000 for key in result.monitor.expected)
