"""The cluster simulator: nsqd, nsqlookupd, producers and consumers on one virtual clock.

Everything is deterministic: a :class:`Scenario` (cluster shape, workload, faults) and a seed
give exactly one run, so a failure is replayed from the one line printed with it::

    python -m nsq_sansio.testing replay <blob>
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from ..server.options import NSQDOptions
from .clock import Scheduler
from .handler import Handler
from .invariants import InvariantViolation, Monitor
from .network import Endpoint, LinkSpec, Network
from .nodes import ConsumerNode, LookupdNode, NsqdNode, ProducerNode, SimNode
from .specs import FLAP_CYCLES, ClusterSpec, ConsumerSpec, Fault, FaultKind, Scenario, Workload

__all__ = [
    "ClusterSpec",
    "ConsumerSpec",
    "Fault",
    "FaultKind",
    "RunResult",
    "Scenario",
    "Simulator",
    "Workload",
    "replay_line",
    "run_scenario",
    "scenario_from_blob",
]


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a run did: final simulated time, counters, and the monitor with everything."""

    end_time: float
    events: int
    messages_expected: int
    messages_finished: int
    deliveries: int
    monitor: Monitor = field(repr=False)
    replay: str = ""


class Simulator:
    """A cluster on a virtual clock. Build it from a :class:`ClusterSpec`, schedule things,
    run. ``strict`` raises :class:`InvariantViolation` at the first violated step."""

    def __init__(
        self,
        spec: ClusterSpec | None = None,
        *,
        seed: int = 0,
        strict: bool = True,
        replay: str = "",
        rdy_per_write: bool = True,
    ) -> None:
        self.spec = spec if spec is not None else ClusterSpec()
        self.seed = seed
        self.strict = strict
        self.replay = replay
        self.rng = random.Random(seed)
        self.scheduler = Scheduler()
        self.net = Network(self.scheduler, random.Random(self.rng.getrandbits(64)), self.spec.link)
        self.net.after = self.after
        self.monitor = Monitor(self, rdy_per_write=rdy_per_write)
        self.net.observer_factories.append(self.monitor.observe)
        self.nodes: dict[str, SimNode] = {}
        self.nsqds: list[NsqdNode] = []
        self.lookupds: list[LookupdNode] = []
        self.consumers: list[ConsumerNode] = []
        self.producers: list[ProducerNode] = []
        self._generation: dict[str, int] = {}
        self._hooks: list[Callable[[Simulator], None]] = []
        #: Set by heal_all(): no fault starts after it.
        self.faults_over = False
        #: Workload publishes scheduled and not yet handed to a producer or taken by an nsqd.
        self.publishes_scheduled = 0
        self._build()

    @property
    def now(self) -> float:
        """The virtual time, in seconds since the run started."""
        return self.scheduler.now

    # -- building -------------------------------------------------------------------------------

    def _add(self, node: SimNode) -> None:
        self.nodes[node.name] = node
        self.net.add_node(node)

    def _build(self) -> None:
        spec = self.spec
        for i in range(spec.lookupd):
            lookupd_options = dataclasses.replace(
                spec.lookupd_options, broadcast_address=f"lookupd{i}", hostname=f"lookupd{i}"
            )
            lookupd = LookupdNode(self, f"lookupd{i}", lookupd_options)
            self.lookupds.append(lookupd)
            self._add(lookupd)
        durable = spec.durable
        for i in range(spec.nsqd):
            options = dataclasses.replace(
                spec.nsqd_options,
                node_id=i,
                broadcast_address=f"nsqd{i}",
                hostname=f"nsqd{i}",
                mem_queue_size=0 if durable else spec.nsqd_options.mem_queue_size,
            )
            nsqd = NsqdNode(
                self,
                f"nsqd{i}",
                options,
                [lk.tcp_address for lk in self.lookupds],
                durable=durable,
                seed=self.rng.getrandbits(32),
            )
            self.nsqds.append(nsqd)
            self._add(nsqd)
            nsqd.restart_topics(self.now)
        for group, cspec in enumerate(spec.consumers):
            for i in range(cspec.count):
                self.add_consumer(cspec, f"c{group}.{i}", start_at=cspec.start_at)
        for each in list(self.nodes.values()):
            self.after(each)

    def add_consumer(
        self, cspec: ConsumerSpec, base: str, *, start_at: float | None = None
    ) -> ConsumerNode:
        """A new consumer named ``base`` (``base~1``, ``base~2``... for replacements)."""
        generation = self._generation.get(base, 0)
        self._generation[base] = generation + 1
        name = base if generation == 0 else f"{base}~{generation}"
        node = ConsumerNode(
            self,
            name,
            self.spec.topic,
            cspec.channel,
            cspec.config,
            cspec.handler,
            nsqd=[] if cspec.use_lookupd and self.lookupds else [n.address for n in self.nsqds],
            lookupd=[lk.http_address for lk in self.lookupds] if cspec.use_lookupd else [],
            seed=self.rng.getrandbits(32),
            pull=cspec.pull,
            fetch_batch=cspec.fetch_batch,
        )
        node.spec = cspec  # type: ignore[attr-defined]
        node.base = base  # type: ignore[attr-defined]
        self.consumers.append(node)
        self._add(node)
        when = self.now if start_at is None else max(start_at, self.now)
        self.scheduler.call_at(when, self._start_consumer, node)
        return node

    def _start_consumer(self, node: ConsumerNode) -> None:
        if node.alive and not node.started and node.drain_started_at is None:
            node.start(self.now)
            self.after(node)

    def add_producer(self, nsqd: NsqdNode) -> ProducerNode:
        """Add a TCP producer node publishing to ``nsqd`` (the workload's publishes go
        through it)."""
        node = ProducerNode(self, f"p{len(self.producers)}", nsqd.address, self.spec.topic)
        self.producers.append(node)
        self._add(node)
        return node

    # -- timers ---------------------------------------------------------------------------------

    def after(self, node: Endpoint) -> None:
        """Re-arm ``node``'s timer after anything touched it."""
        if not node.alive:
            return
        deadline = node.next_deadline()
        if deadline is None:
            return
        current = node.timer_at
        if current is not None and current <= deadline:
            return
        now = self.scheduler.now
        if deadline <= now:
            deadline = now
        node.timer_token += 1
        node.timer_at = deadline
        self.scheduler.call_at(deadline, self._fire, (node, node.timer_token))

    def _fire(self, item: tuple[Endpoint, int]) -> None:
        node, token = item
        if token != node.timer_token:
            return
        node.timer_at = None
        if not node.alive:
            return
        now = self.scheduler.now
        node.handle_timer(now)
        deadline = node.next_deadline()
        if deadline is not None and deadline <= now:
            # no progress at this instant: look again a little later instead of spinning
            node.timer_token += 1
            node.timer_at = now + 0.001
            self.scheduler.call_at(now + 0.001, self._fire, (node, node.timer_token))
            return
        self.after(node)

    # -- scheduling work and faults -------------------------------------------------------------

    def schedule_workload(self, workload: Workload) -> None:
        """Publish ``workload.messages`` unique bodies (``b"m<n>"``)."""
        if not self.nsqds or workload.messages <= 0:
            return
        nsqds = [self.nsqds[i] for i in workload.targets] if workload.targets else self.nsqds
        producers = [self.add_producer(n) for n in nsqds] if workload.via_tcp else []
        interval = workload.batch / workload.rate if workload.rate > 0 else 0.0
        count = 0
        index = 0
        while count < workload.messages:
            size = min(workload.batch, workload.messages - count)
            bodies = [_body(count + k, workload.body_size) for k in range(size)]
            count += size
            target = index % len(nsqds)
            at = workload.start + index * interval
            self.publishes_scheduled += 1
            if workload.via_tcp:
                self.scheduler.call_at(at, self._publish_tcp, (producers[target], bodies))
            else:
                self.scheduler.call_at(at, self._publish_http, (nsqds[target], bodies))
            index += 1

    def _publish_tcp(self, item: tuple[ProducerNode, list[bytes]]) -> None:
        producer, bodies = item
        self.publishes_scheduled -= 1
        producer.publish(bodies, self.now)
        self.after(producer)

    def _publish_http(self, item: tuple[NsqdNode, list[bytes]]) -> None:
        nsqd, bodies = item
        if not nsqd.publish(self.spec.topic, bodies, self.now):
            # refused (down): try again later, as an HTTP publisher with retries would
            self.scheduler.call_at(self.now + 1.0, self._publish_http, item)
        else:
            self.publishes_scheduled -= 1
        self.after(nsqd)

    def schedule_fault(self, fault: Fault) -> None:
        """Apply ``fault`` at its time (``fault.at``), ending it after its duration."""
        self.scheduler.call_at(fault.at, self._apply_fault, fault)

    def _apply_fault(self, fault: Fault) -> None:
        node = self.nodes.get(fault.target)
        if node is None:
            return
        now = self.now
        kind = fault.kind
        if kind is FaultKind.DROP_CONNECTIONS:
            for conn in list(self.net.conns.values()):
                if conn.client is node or conn.server is node:
                    self.net.drop(conn)
        elif kind is FaultKind.PARTITION:
            self._cut_off(node.name, fault.duration)
        elif kind is FaultKind.FLAP:
            for cycle in range(FLAP_CYCLES):
                self.scheduler.call_at(
                    now + 2 * cycle * fault.duration, self._flap, (node.name, fault.duration)
                )
        elif kind is FaultKind.CRASH or kind is FaultKind.STOP:
            if isinstance(node, NsqdNode):
                node.crash(now, clean=kind is FaultKind.STOP)
            elif isinstance(node, LookupdNode):
                node.crash(now)
            else:
                return
            self.scheduler.call_at(now + fault.duration, self._restart, node)
        elif kind is FaultKind.KILL_CONSUMER or kind is FaultKind.DRAIN_CONSUMER:
            if not isinstance(node, ConsumerNode) or not node.alive:
                return
            if node.drain_started_at is not None:
                return
            if kind is FaultKind.KILL_CONSUMER:
                node.kill(now)
            else:
                node.drain(now)
                self.after(node)
            cspec: ConsumerSpec = node.spec  # type: ignore[attr-defined]
            self.add_consumer(
                cspec,
                node.base,  # type: ignore[attr-defined]
                start_at=now + fault.duration,
            )

    def _cut_off(self, name: str, duration: float) -> None:
        """Partition node ``name`` from every other node (these at the time) for ``duration``."""
        others = [other for other in self.nodes if other != name]
        cut = self.net.partition([[name], others])
        self.scheduler.call_at(self.now + duration, self._heal, cut)

    def _flap(self, item: tuple[str, float]) -> None:
        if not self.faults_over:  # a flap still going when everything heals stops there
            self._cut_off(*item)

    def _heal(self, cut: int) -> None:
        self.net.heal(cut)

    def _restart(self, node: SimNode) -> None:
        if isinstance(node, (NsqdNode, LookupdNode)):
            node.restart(self.now)
        self.after(node)

    def heal_all(self) -> None:
        """End partitions and restart every crashed broker (the settle phase begins: faults
        still under way, such as a flapping link's next cut, stop)."""
        self.faults_over = True
        self.net.heal()
        for node in self.nodes.values():
            if not node.alive and isinstance(node, (NsqdNode, LookupdNode)):
                self._restart(node)

    def add_hook(self, hook: Callable[[Simulator], None]) -> None:
        """Call ``hook(sim)`` after every event (user invariants)."""
        self._hooks.append(hook)

    # -- running --------------------------------------------------------------------------------

    def run_until(self, deadline: float) -> None:
        """Advance the clock to ``deadline``; strict mode raises at the first violation."""
        monitor = self.monitor
        hooks = self._hooks

        def stop() -> bool:
            for hook in hooks:
                hook(self)
            return bool(monitor.violations) and self.strict

        self.scheduler.run_until(deadline, stop)
        self.raise_if_violated()

    def run_for(self, seconds: float) -> None:
        """Run the simulation ``seconds`` of virtual time further."""
        self.run_until(self.now + seconds)

    def settle(self, limit: float, step: float = 5.0, *, patience: float = 300.0) -> bool:
        """Run until the whole workload is published (none waits in a producer for a broker
        the faults kept away), every accepted message is finished, given up or excused and the
        brokers are empty; True when it settled. Gives up after ``limit`` simulated seconds
        without reaching that, or after ``patience`` seconds in which no message got accepted
        or done (slow consumers with a long backlog keep going as long as they make
        progress)."""
        monitor = self.monitor
        patience = min(patience, limit)
        deadline = self.now + limit
        last_progress = self.now
        done = -1
        while True:
            if not self.publishing() and not monitor.outstanding() and self._brokers_empty():
                return True
            count = (
                len(monitor.expected)
                + len(monitor.finished)
                + len(monitor.given_up)
                + len(monitor.excused)
            )
            if count != done:
                done = count
                last_progress = self.now
                deadline = max(deadline, self.now + patience)
            if self.now >= deadline or self.now - last_progress >= patience:
                return False
            self.run_until(min(deadline, self.now + step))

    def publishing(self) -> bool:
        """Whether some of the workload is not accepted by an nsqd yet: a publish still to
        come, or bodies a producer holds (queued behind a reconnect, or sent and not
        acknowledged)."""
        if self.publishes_scheduled:
            return True
        return any(p.queue or p.pending for p in self.producers)

    def _brokers_empty(self) -> bool:
        for node in self.nsqds:
            if not node.alive:
                continue
            stats = node.nsqd.stats(self.now, include_clients=False)
            for topic in stats["topics"]:
                for chan in topic["channels"]:
                    if chan["depth"] or chan["in_flight_count"] or chan["deferred_count"]:
                        return False
        return True

    def raise_if_violated(self) -> None:
        """Raise :class:`InvariantViolation` (every violation so far, and the replay line)
        if any invariant broke."""
        if self.monitor.violations:
            raise InvariantViolation(list(self.monitor.violations), self.replay)

    def result(self) -> RunResult:
        """What the run did so far: messages expected and finished, deliveries, events, the
        end time."""
        monitor = self.monitor
        done = monitor.finished | monitor.given_up
        return RunResult(
            end_time=self.now,
            events=self.scheduler.events_run,
            messages_expected=len(monitor.expected),
            messages_finished=sum(1 for key in monitor.expected if key in done),
            deliveries=monitor.messages_sent,
            monitor=monitor,
            replay=self.replay,
        )


def _body(index: int, size: int) -> bytes:
    body = b"m%d" % index
    if size > len(body):
        body += b"." + b"x" * (size - len(body) - 1)
    return body


# --- scenarios: run, serialise, replay ---------------------------------------------------------


def run_scenario(
    scenario: Scenario, *, check_discovery: bool = True, rdy_per_write: bool = True
) -> RunResult:
    """Run a scenario to the end: faults until ``duration``, then heal and settle, then the
    final invariants. Raises :class:`InvariantViolation` (with the replay line) on failure.
    ``rdy_per_write=False`` checks the RDY sum per consumer step only."""
    line = replay_line(scenario) + ("" if rdy_per_write else " --rdy-per-step")
    sim = Simulator(scenario.cluster, seed=scenario.seed, replay=line, rdy_per_write=rdy_per_write)
    sim.schedule_workload(scenario.workload)
    for fault in scenario.faults:
        sim.schedule_fault(fault)
    sim.run_until(scenario.duration)
    sim.heal_all()
    sim.settle(scenario.settle)
    if check_discovery:
        # discovery needs a poll after the last change (and replacements started by the
        # faults must have started): give every consumer a few intervals after that
        longest = max(
            (
                c.config.lookupd_poll_interval * (1 + c.config.lookupd_poll_jitter)
                for c in scenario.cluster.consumers
            ),
            default=0.0,
        )
        last_start = max((f.at + f.duration for f in scenario.faults), default=0.0)
        sim.run_until(
            max(sim.now, last_start)
            + 3 * longest
            + scenario.cluster.lookupd_options.tombstone_lifetime
        )
    sim.monitor.check_final(sim.now, discovery=check_discovery)
    sim.raise_if_violated()
    return sim.result()


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # only what differs from the defaults: short lines (a blob replays on the same version)
        out: dict[str, Any] = {"__type__": type(value).__name__}
        for f in dataclasses.fields(value):
            current = getattr(value, f.name)
            if f.default is not dataclasses.MISSING:
                default: Any = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                out[f.name] = _encode(current)
                continue
            if current != default or type(current) is not type(default):
                out[f.name] = _encode(current)
        return out
    if isinstance(value, enum.Enum):
        return {"__enum__": type(value).__name__, "value": value.value}
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if callable(value):
        raise TypeError(f"cannot serialise {value!r}: replay needs handlers without functions")
    return value


def _types() -> dict[str, type]:
    from ..server.lookupd import LookupdOptions as LO

    return {
        t.__name__: t
        for t in (
            ClusterSpec,
            ConsumerSpec,
            Workload,
            Fault,
            Scenario,
            Config,
            NSQDOptions,
            LO,
            LinkSpec,
            Handler,
            FaultKind,
        )
    }


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if isinstance(value, dict):
        types = _types()
        if "__enum__" in value:
            return types[value["__enum__"]](value["value"])
        if "__bytes__" in value:
            return bytes.fromhex(value["__bytes__"])
        kind = types[value["__type__"]]
        kwargs = {k: _decode(v) for k, v in value.items() if k != "__type__"}
        return kind(**kwargs)
    return value


def scenario_blob(scenario: Scenario) -> str:
    """``scenario`` as one line of text (compressed JSON, URL-safe base64): what a replay
    line carries."""
    raw = json.dumps(_encode(scenario), separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode()


def scenario_from_blob(blob: str) -> Scenario:
    """The scenario a :func:`scenario_blob` line holds (the replay command reads it)."""
    raw = zlib.decompress(base64.urlsafe_b64decode(blob.encode()))
    scenario = _decode(json.loads(raw))
    assert isinstance(scenario, Scenario)
    return scenario


def replay_line(scenario: Scenario) -> str:
    """The one line that replays ``scenario`` (empty when it holds functions)."""
    try:
        return f"python -m nsq_sansio.testing replay {scenario_blob(scenario)}"
    except TypeError:
        return f"(not replayable from one line: it holds user functions; seed={scenario.seed})"
