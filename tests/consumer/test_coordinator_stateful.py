"""Hypothesis stateful test: random connections lost and found, messages, answers, timers,
max_in_flight changes, backoff and lookupd answers; invariants checked after every step, and
at the end nothing is lost (published = finished + given up + still on the servers).

Bytes take up to ``latency`` (drawn per run) to cross each connection, and a rule delivers the
oldest chunk of any pipe early, so connections reorder: messages are on their way while RDY
changes, RDY and answers are on their way while nsqd sends. The max_in_flight bound is read
from nsqd's side (what it sent, less the answers on their way to it), as the simulator does."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from nsq_sansio.backoff import BackoffPhase
from nsq_sansio.config import Config
from nsq_sansio.consumer import (
    ConsumerState,
    Deliver,
    DrainComplete,
    FetchResult,
    GiveUp,
    TakenBack,
)
from nsq_sansio.errors import ServerError

from .harness import TO_SERVER, World, held_by_connected_clients, server_ready_counts

NODES = 3
MAX_RDY = 4


class CoordinatorMachine(RuleBasedStateMachine):
    world: World

    @initialize(
        mif=st.integers(0, 12),
        seed=st.integers(0, 2**16),
        pull=st.booleans(),
        max_attempts=st.sampled_from([0, 2, 5]),
        latency=st.sampled_from([0.0, 0.02, 0.1]),
    )
    def setup(self, mif: int, seed: int, pull: bool, max_attempts: int, latency: float) -> None:
        config = Config(
            max_in_flight=mif,
            max_attempts=max_attempts,
            default_requeue_delay=1.0,
            max_requeue_delay=5.0,
            backoff_multiplier=0.5,
            max_backoff_duration=8.0,
            low_rdy_idle_timeout=2.0,
            rdy_redistribute_interval=1.0,
            reconnect_delay=0.5,
            max_reconnect_delay=4.0,
            lookupd_poll_interval=10.0,
            heartbeat_interval=5.0,
        )
        self.world = World(
            NODES,
            config,
            seed=seed,
            pull=pull,
            lookupd=["l1:4161"],
            node_options={"max_rdy_count": MAX_RDY, "msg_timeout": 20.0},
            latency=latency,  # under RDY_SETTLE_MIN: what the settle time assumes
        )
        self._check_every_rdy(self.world)
        self.world.start()
        self.world.deliver_all()  # the handshakes
        assert len(self.world.coordinator.connection_ids()) == NODES  # not a vacuous run
        self.published = 0
        self.finished = 0
        self.answered: list[Deliver] = []
        self.pull = pull
        #: What may be held: max_in_flight, or more right after it was lowered (what was
        #: already in flight, or may still be sent under the RDY nsqd has not read as lowered
        #: yet, stays until answered; then the bound closes in).
        self.allowance = mif

    @staticmethod
    def _check_every_rdy(world: World) -> None:
        """Check the budget at every RDY the coordinator decides, not only between steps:
        a raise must never take the sum over max_in_flight, even for a moment."""
        c = world.coordinator
        send = c._ledger.send

        def checked(link: Any, count: int, now: float) -> None:
            before = link.rdy
            send(link, count, now)
            if link.rdy > before:
                assert c.total_rdy <= c.max_in_flight, (c.total_rdy, c.max_in_flight)
                if c.backoff_phase is not BackoffPhase.NORMAL:  # the test's allowance
                    assert c.total_rdy <= min(c.backoff_allowance, c.max_in_flight)

        c._ledger.send = checked  # type: ignore[method-assign]

        # Bytes here never take longer than the settle time, so no message may arrive beyond
        # its connection's claim (the guard for partitions must never be needed): one that
        # does means a ceiling was released too early, even if the guard then hid it.
        take_late = c._ledger.take_late
        world.late = []  # type: ignore[attr-defined]

        def watched(link: Any, arriving: int, now: float, *, may_grow: bool) -> bool:
            if link.live_count(now)[0] + arriving > link.claim:
                world.late.append((now, link.conn_id, arriving, link.claim))  # type: ignore[attr-defined]
            return take_late(link, arriving, now, may_grow=may_grow)

        c._ledger.take_late = watched  # type: ignore[method-assign]

    # --- the world ---------------------------------------------------------------------------

    @rule(node=st.integers(0, NODES - 1), count=st.integers(1, 4))
    def publish(self, node: int, count: int) -> None:
        self.world.publish(node, count)
        self.published += count

    @rule(count=st.integers(1, 3))
    def publish_everywhere(self, count: int) -> None:
        """Messages on every nsqd at once: whichever connection gets RDY can send."""
        for node in range(NODES):
            self.world.publish(node, count)
        self.published += NODES * count

    @rule(node=st.integers(0, NODES - 1))
    def kill(self, node: int) -> None:
        self.world.kill(node)

    @rule(node=st.integers(0, NODES - 1))
    def revive(self, node: int) -> None:
        self.world.revive(node)

    @rule(dt=st.sampled_from([0.01, 0.1, 0.5, 1.0, 2.5, 7.0, 25.0]))
    def advance(self, dt: float) -> None:
        self.world.advance(dt)

    @precondition(lambda self: self.world.in_transit())
    @rule(index=st.integers(0, 20))
    def deliver_early(self, index: int) -> None:
        """The oldest chunk of one pipe arrives now, ahead of the others."""
        pipes = self.world.in_transit()
        self.world.deliver(pipes[index % len(pipes)])

    @rule(nodes=st.sets(st.integers(0, NODES - 1)), garbage=st.booleans())
    def lookupd_answers(self, nodes: set[int], garbage: bool) -> None:
        w = self.world
        for request in list(w.http.values()):
            if garbage:
                w.coordinator.http_data(request.request_id, b"HTTP/1.1 200 OK\r\n\r\n{[", w.now)
                w.coordinator.http_data(request.request_id, b"", w.now)
            else:
                body = json.dumps(
                    {
                        "producers": [
                            {"broadcast_address": w.addresses[i].host, "tcp_port": 4150}
                            for i in sorted(nodes)
                        ]
                    }
                ).encode()
                w.coordinator.http_response(request.request_id, 200, body, w.now)
        w.pump()

    # --- the user ----------------------------------------------------------------------------

    def _take(self, index: int) -> Deliver | None:
        w = self.world
        for result in w.results:
            w.inbox.extend(result.messages)
        w.results.clear()
        if not w.inbox:
            return None
        return w.inbox.pop(index % len(w.inbox))

    @rule(index=st.integers(0, 50))
    def finish(self, index: int) -> None:
        d = self._take(index)
        if d is not None:
            if self.world.coordinator.finish(d, self.world.now):
                self.finished += 1
            self.answered.append(d)
            self.world.pump()

    @rule(index=st.integers(0, 50), delay=st.sampled_from([None, 0.0, 3.0]), backoff=st.booleans())
    def requeue(self, index: int, delay: float | None, backoff: bool) -> None:
        d = self._take(index)
        if d is not None:
            self.world.coordinator.requeue(d, self.world.now, delay, backoff=backoff)
            self.answered.append(d)
            self.world.pump()

    @rule(index=st.integers(0, 50))
    def touch(self, index: int) -> None:
        w = self.world
        if w.inbox:
            w.coordinator.touch(w.inbox[index % len(w.inbox)], w.now)
            w.pump()

    @rule(n=st.integers(0, 12))
    def set_max_in_flight(self, n: int) -> None:
        c = self.world.coordinator
        self.allowance = max(n, held_by_connected_clients(self.world), c._claimed)
        c.set_max_in_flight(n, self.world.now)
        self.world.pump()

    @precondition(lambda self: self.pull)
    @rule(batch=st.integers(1, 6), expires=st.sampled_from([None, 1.0, 5.0]), no_wait=st.booleans())
    def fetch(self, batch: int, expires: float | None, no_wait: bool) -> None:
        self.world.coordinator.fetch(batch, self.world.now, expires=expires, no_wait=no_wait)
        self.world.pump()

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def rdy_within_budget(self) -> None:
        c = self.world.coordinator
        rdy = self.world.rdy_by_conn()
        assert sum(rdy.values()) == c.total_rdy
        assert c.total_rdy <= c.max_in_flight
        assert all(0 <= n <= MAX_RDY for n in rdy.values())
        if c.backoff_phase is BackoffPhase.WAITING:
            assert c.total_rdy == 0
        elif c.backoff_phase is BackoffPhase.TESTING:
            # one message more than was held when the test began, two more per success since
            assert c.total_rdy <= min(c.backoff_allowance, c.max_in_flight)
        if c.state is not ConsumerState.RUNNING:
            assert c.total_rdy == 0

    @invariant()
    def held_within_max_in_flight(self) -> None:
        # What nsqd counts in flight on this consumer's connections (sent, not answered, not
        # timed out) is what the user holds: connections joining, leaving and being lowered
        # never take it over max_in_flight (nor over what was held when it was lowered).
        c = self.world.coordinator
        held = held_by_connected_clients(self.world)
        assert held <= self.allowance, (held, self.allowance, c.max_in_flight)
        # The bound closes in as answers come: to what is held, or what may still come (the
        # capacity the coordinator still counts, e.g. an RDY on its way down).
        self.allowance = max(c.max_in_flight, min(self.allowance, max(held, c._claimed)))

    @invariant()
    def no_message_arrives_beyond_its_claim(self) -> None:
        assert self.world.late == []  # type: ignore[attr-defined]

    @invariant()
    def every_write_stays_within_budget(self) -> None:
        # Connections are written lowered-RDY first: no raise is ever seen over budget.
        assert self.world.over_budget == []

    @invariant()
    def server_agrees_on_rdy(self) -> None:
        w = self.world
        held = server_ready_counts(w)
        for conn_id, count in w.rdy_by_conn().items():
            if conn_id in held and not w.pipes.get((conn_id, TO_SERVER)):  # nothing on its way
                assert held[conn_id] == count, (conn_id, held[conn_id], count)

    @invariant()
    def old_capacity_is_settling(self) -> None:
        # A connection whose ceiling is above both its written and its decided RDY still
        # counts old capacity: it must be settling, or nothing ever gives that budget back.
        c = self.world.coordinator
        for conn_id in c.connection_ids():
            link = c._links[conn_id]
            if link.ceiling > max(link.wire_rdy, link.rdy):
                assert conn_id in c._settling, (conn_id, link.ceiling, link.wire_rdy, link.rdy)
        assert c._claimed == sum(c._links[i].claim for i in c.connection_ids())

    @invariant()
    def answered_messages_are_not_in_flight(self) -> None:
        c = self.world.coordinator
        for d in self.answered[-20:]:
            assert c.deadline(d) is None

    def teardown(self) -> None:
        w = getattr(self, "world", None)
        if w is None:
            return
        # Answer everything still held, drain, and let nsqd time out what died with sockets.
        for node in range(NODES):
            w.revive(node)
        w.deliver_all()
        while True:
            d = self._take(0)
            if d is None:
                break
            if w.coordinator.finish(d, w.now):
                self.finished += 1
            w.pump()
        w.coordinator.drain(w.now, timeout=5.0)
        w.pump()
        w.advance(10.0)
        assert w.of_type(DrainComplete), "drain must finish"
        assert not w.inbox or all(w.coordinator.deadline(d) is None for d in w.inbox)
        w.advance(30.0)  # msg_timeout on nsqd for messages of connections that died
        assert w.server_in_flight() == 0
        remaining = w.server_depth()
        # FINs nsqd accepted: every FIN it read (user or give-up; one written on a connection
        # that broke before nsqd read it is lost with it) minus those it refused as too late
        # (E_FIN_FAILED: the message had timed out and is counted in ``remaining``).
        refused = [
            a
            for a in w.actions
            if isinstance(a, TakenBack) and a.command == "FIN" and isinstance(a.error, ServerError)
        ]
        assert len(refused) <= w.fins_refused  # some refusals die with their connection
        accepted = w.fins_read - w.fins_refused
        given_up = len([a for a in w.actions if isinstance(a, GiveUp)])
        assert accepted >= given_up
        assert self.published == accepted + remaining, (
            self.published,
            accepted,
            remaining,
            self.finished,
            given_up,
        )
        assert not any(isinstance(a, FetchResult) for a in w.coordinator.take_actions())


CoordinatorMachine.TestCase.settings = settings(
    max_examples=int(__import__("os").environ.get("CONSUMER_EXAMPLES", "60")),
    stateful_step_count=35,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoordinatorStateful = CoordinatorMachine.TestCase
