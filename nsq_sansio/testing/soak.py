"""The long search (soak): generated clusters and fault schedules, round after round.

:func:`soak` runs the simulator's properties (every invariant after every step and at the end,
plus each property's own check) over fresh hypothesis-generated scenarios, ``batch`` per
property per round, until ``schedules`` have run or ``stop()`` says so. Round ``n`` draws from
seed ``seed + n``, so a round can be run again; each violation is reported with the one line
that replays it, and the search goes on. Pure like the rest of :mod:`nsq_sansio`: no clock
(``stop`` is how a caller bounds it in time, as ``tests/sim/soak.py --minutes N`` does).
Needs ``hypothesis`` (the ``test`` extra).

``python -m nsq_sansio.testing soak --schedules N [--seed S]`` runs it from the command line.
The same properties run in ``tests/sim`` (a bounded number of examples in CI, more with
``NSQ_SIM_PROFILE``); this is the open-ended version of that search.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

from .handler import Handler
from .simulator import RunResult, replay_line, run_scenario
from .specs import Scenario
from .violations import InvariantViolation

__all__ = ["PROPERTIES", "Finding", "SoakReport", "soak"]


def _faults_accounted(result: RunResult) -> None:
    """Every accepted message is finished, given up, or excused by a crash without disk."""
    monitor = result.monitor
    excused = monitor.excused - monitor.finished - monitor.given_up
    assert result.messages_finished + len(excused) == result.messages_expected


def _nothing_lost(result: RunResult) -> None:
    """Without faults nothing is excused and every message is finished or given up."""
    assert not result.monitor.excused
    assert result.messages_finished == result.messages_expected


@dataclass(frozen=True)
class _Property:
    """A strategy of scenarios, how to adapt one before it runs, and what must hold after."""

    strategy: Callable[[], SearchStrategy[Scenario]]
    check: Callable[[RunResult], None]
    adapt: Callable[[Scenario], Scenario] = lambda scenario: scenario


def _properties() -> dict[str, _Property]:
    from .strategies import scenarios  # hypothesis is only needed from here on

    return {
        # tests/sim/test_properties.py, with more faults than CI draws
        "faults": _Property(
            lambda: scenarios(max_nsqd=4, max_messages=150, max_faults=6, hangs=True),
            _faults_accounted,
        ),
        "no-faults": _Property(
            lambda: scenarios(max_nsqd=3, max_messages=100, max_faults=0),
            _nothing_lost,
        ),
        # tests/sim/test_user_handler.py: quick handlers, so the faults dominate
        "quick-handler": _Property(
            lambda: scenarios(max_messages=60, max_faults=4),
            _faults_accounted,
            lambda scenario: scenario.with_handler(Handler(duration=0.01)),
        ),
    }


#: The properties a soak runs, by name (``--property`` picks some).
PROPERTIES = ("faults", "no-faults", "quick-handler")


@dataclass
class Finding:
    """One violated property: where (property, round seed), what, and how to replay it."""

    prop: str
    seed: int
    detail: str
    replay: str


@dataclass
class SoakReport:
    """What a soak did: schedules run per property, the round seeds, findings."""

    schedules: dict[str, int] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.schedules.values())


def soak(
    *,
    seed: int,
    schedules: int | None = None,
    batch: int = 20,
    properties: tuple[str, ...] = PROPERTIES,
    stop: Callable[[], bool] = lambda: False,
    out: Callable[[str], None] = print,
) -> SoakReport:
    """Run ``properties`` over generated scenarios until ``schedules`` have run (None: no
    limit) or ``stop()`` is true; see the module docstring. Prints as it goes to ``out``."""
    known = _properties()
    unknown = [name for name in properties if name not in known]
    if unknown:
        raise ValueError(f"unknown properties {unknown}; known: {sorted(known)}")
    report = SoakReport(schedules=dict.fromkeys(properties, 0))

    def over() -> bool:
        return (schedules is not None and report.total >= schedules) or stop()

    out(f"soak: properties {', '.join(properties)}; first round seed {seed}")
    while not over():
        round_seed = seed + len(report.seeds)
        report.seeds.append(round_seed)
        for name in properties:
            _round(name, known[name], round_seed, batch, report, over, out)
        counts = ", ".join(f"{name} {count}" for name, count in report.schedules.items())
        out(
            f"round {len(report.seeds)} (seed {round_seed}): {report.total} schedules "
            f"({counts}), {len(report.findings)} violations"
        )
    out(
        f"soak done: {report.total} schedules, {len(report.seeds)} rounds "
        f"(seeds {seed}..{seed + len(report.seeds) - 1}), {len(report.findings)} violations"
    )
    for finding in report.findings:
        out(f"  {finding.prop} (round seed {finding.seed}): {finding.detail}")
        out(f"    {finding.replay}")
    return report


def _round(
    name: str,
    prop: _Property,
    round_seed: int,
    batch: int,
    report: SoakReport,
    over: Callable[[], bool],
    out: Callable[[str], None],
) -> None:
    """``batch`` scenarios of one property, drawn from ``round_seed``; failures are recorded
    (and printed at once), never raised, so the search goes on."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    def found(scenario: Scenario, detail: str) -> None:
        finding = Finding(name, round_seed, detail, replay_line(scenario))
        report.findings.append(finding)
        out(f"VIOLATION {name} (round seed {round_seed}): {detail}")
        out(f"  {finding.replay}")

    def run(scenario: Scenario) -> None:
        if over():
            return
        scenario = prop.adapt(scenario)
        report.schedules[name] += 1
        try:
            prop.check(run_scenario(scenario))
        except InvariantViolation as exc:
            lines = str(exc).splitlines()
            found(scenario, "; ".join(line.strip() for line in lines[1:-1]))
        except Exception as exc:  # a crash, or the property's own check
            where = traceback.extract_tb(exc.__traceback__)[-1]
            found(scenario, f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})")

    test: Callable[[], None] = settings(
        max_examples=batch,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )(hypothesis_seed(round_seed)(given(prop.strategy())(run)))
    test()
