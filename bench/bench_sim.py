"""Simulator throughput: simulated messages and simulated seconds per real second.

Runs whole clusters (nsqd, lookupd, producers, consumers, the network and every invariant
check) on the virtual clock and prints how fast that goes::

    python bench/bench_sim.py [--messages 20000] [--nsqd 3] [--consumers 4]

Three shapes: a busy cluster (messages through everything), a busy cluster under faults, and an
idle cluster (heartbeats, lookupd polls) that shows how much simulated time a real second buys.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nsq_sansio.testing import (
    ClusterSpec,
    ConsumerSpec,
    Fault,
    FaultKind,
    Handler,
    Scenario,
    Workload,
    run_scenario,
)


def _run(label: str, scenario: Scenario) -> None:
    start = time.perf_counter()
    result = run_scenario(scenario, check_discovery=False)
    elapsed = time.perf_counter() - start
    print(
        f"{label:<28} {result.messages_finished:>7} msgs  {result.deliveries:>7} deliveries  "
        f"{result.end_time:>8.0f} sim-s  {elapsed:>6.2f} real-s  "
        f"{result.deliveries / elapsed:>9.0f} sim-msgs/s  "
        f"{result.end_time / elapsed:>9.0f} sim-s/s  {result.events / elapsed:>8.0f} events/s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--nsqd", type=int, default=3)
    parser.add_argument("--consumers", type=int, default=4)
    args = parser.parse_args()
    consumer = ConsumerSpec(
        count=args.consumers,
        handler=Handler(duration=0.001),
        config=ConsumerSpec().config.replace(max_in_flight=100),
    )
    cluster = ClusterSpec(nsqd=args.nsqd, consumers=(consumer,))
    busy = Workload(messages=args.messages, rate=5_000.0, batch=20)
    _run("busy cluster", Scenario(cluster=cluster, workload=busy, duration=10.0, settle=300.0))
    faults = (
        Fault(2.0, FaultKind.PARTITION, "nsqd0", 3.0),
        Fault(3.0, FaultKind.CRASH, f"nsqd{args.nsqd - 1}", 2.0),
        Fault(4.0, FaultKind.KILL_CONSUMER, "c0.0", 1.0),
        Fault(5.0, FaultKind.DRAIN_CONSUMER, "c0.1", 1.0),
    )
    _run(
        "busy cluster + faults",
        Scenario(cluster=cluster, workload=busy, faults=faults, duration=10.0, settle=300.0),
    )
    # production-like timers: lookupd polls every 60 s, heartbeats every 30 s
    calm = ConsumerSpec(
        count=args.consumers,
        config=ConsumerSpec().config.replace(lookupd_poll_interval=60.0, heartbeat_interval=30.0),
    )
    idle = dataclasses.replace(
        cluster,
        consumers=(calm,),
        lookup_ping_interval=15.0,
        nsqd_options=dataclasses.replace(cluster.nsqd_options, client_timeout=60.0),
    )
    _run(
        "idle cluster (1 day)",
        Scenario(cluster=idle, workload=Workload(messages=0), duration=86400.0, settle=0.0),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
