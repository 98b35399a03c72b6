"""Deterministic simulation of whole NSQ clusters (no IO): the core's nsqd, nsqlookupd,
consumer and producer state machines on a virtual clock and a simulated network with faults.

Quick start::

    from nsq_sansio.testing import Scenario, ClusterSpec, ConsumerSpec, Handler, run_scenario

    result = run_scenario(Scenario(cluster=ClusterSpec(nsqd=3), seed=7))
    assert result.messages_finished == result.messages_expected

Hypothesis strategies live in :mod:`nsq_sansio.testing.strategies` (needs ``hypothesis``);
ready-made field scenarios in :mod:`nsq_sansio.testing.scenarios`.
"""

from .clock import Scheduler
from .invariants import Invariant, InvariantViolation, Monitor, Violation
from .network import LinkSpec, Network, SimConn
from .nodes import (
    HANG,
    ConsumerNode,
    Handler,
    LookupdNode,
    NsqdNode,
    ProducerNode,
    SimDisk,
    SimNode,
)
from .simulator import (
    ClusterSpec,
    ConsumerSpec,
    Fault,
    FaultKind,
    RunResult,
    Scenario,
    Simulator,
    Workload,
    replay_line,
    run_scenario,
    scenario_blob,
    scenario_from_blob,
)

__all__ = [
    "HANG",
    "ClusterSpec",
    "ConsumerNode",
    "ConsumerSpec",
    "Fault",
    "FaultKind",
    "Handler",
    "Invariant",
    "InvariantViolation",
    "LinkSpec",
    "LookupdNode",
    "Monitor",
    "Network",
    "NsqdNode",
    "ProducerNode",
    "RunResult",
    "Scenario",
    "Scheduler",
    "SimConn",
    "SimDisk",
    "SimNode",
    "Simulator",
    "Violation",
    "Workload",
    "replay_line",
    "run_scenario",
    "scenario_blob",
    "scenario_from_blob",
]
