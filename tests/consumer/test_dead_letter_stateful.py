"""Hypothesis stateful test of dead letters: messages requeued until given up, dead-letter
publishes that succeed, fail or come late, nsqd nodes lost and found, drains; push and pull.

Invariants after every step: a message is FIN'd on the wire only when the user finished it
or it was stored on the dead-letter topic first; nothing is handed over twice at once. At the
end nothing is lost: every body published is finished, dead-lettered or still on an nsqd."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from nsq_sansio.config import Config
from nsq_sansio.consumer import Deliver

from .harness import World

NODES = 2


class DeadLetterMachine(RuleBasedStateMachine):
    world: World

    @initialize(
        seed=st.integers(0, 2**16), pull=st.booleans(), max_attempts=st.sampled_from([1, 2])
    )
    def setup(self, seed: int, pull: bool, max_attempts: int) -> None:
        config = Config(
            max_in_flight=4,
            max_attempts=max_attempts,
            default_requeue_delay=1.0,
            max_requeue_delay=3.0,
            backoff_enabled=False,
            reconnect_delay=0.5,
            max_reconnect_delay=2.0,
            heartbeat_interval=5.0,
        )
        self.world = World(
            NODES,
            config,
            seed=seed,
            pull=pull,
            dead_letter=True,
            node_options={"msg_timeout": 20.0},
        )
        self.world.start()
        self.pull = pull
        self.published: set[bytes] = set()
        self.finished: set[bytes] = set()
        self.stored: set[bytes] = set()  # bodies on the dead-letter topic (a set: at least once)
        self.body_of: dict[bytes, bytes] = {}  # message id -> body
        self.held: list[Deliver] = []
        self.fins_checked = 0

    def _collect(self) -> None:
        w = self.world
        for d in w.inbox:
            self.body_of[d.id] = d.body
            self.held.append(d)
        w.inbox.clear()
        for result in w.results:
            for d in result.messages:
                self.body_of[d.id] = d.body
                self.held.append(d)
        w.results.clear()
        for d in w.dead_letters:
            self.body_of[d.id] = d.body

    @rule(node=st.integers(0, NODES - 1))
    def publish(self, node: int) -> None:
        body = b"m%d" % len(self.published)
        self.published.add(body)
        self.world.publish(node, body=body)
        self._collect()

    @rule(index=st.integers(0, 20), finish=st.booleans())
    def answer(self, index: int, finish: bool) -> None:
        if not self.held:
            return
        d = self.held.pop(index % len(self.held))
        w = self.world
        if finish:
            if w.coordinator.finish(d, w.now):
                self.finished.add(d.body)
        else:
            w.coordinator.requeue(d, w.now, delay=0.0)
        w.pump()
        self._collect()

    @rule(index=st.integers(0, 20), outcome=st.sampled_from(["stored", "failed", "none"]))
    def report_dead_letter(self, index: int, outcome: str) -> None:
        w = self.world
        if not w.dead_letters:
            return
        d = w.dead_letters.pop(index % len(w.dead_letters))
        if outcome == "stored":
            self.stored.add(d.body)  # the publish succeeded before the report
            w.coordinator.dead_letter_published(d, w.now, "dead")
        elif outcome == "failed":
            w.coordinator.dead_letter_failed(d, w.now)
        else:  # never published anywhere: the stateful test must still see it kept
            w.coordinator.dead_letter_failed(d, w.now)
        w.pump()
        self._collect()

    @rule(batch=st.integers(1, 3))
    def fetch(self, batch: int) -> None:
        if self.pull:
            self.world.coordinator.fetch(batch, self.world.now, expires=1.0)
            self.world.pump()
            self._collect()

    @rule(node=st.integers(0, NODES - 1))
    def kill(self, node: int) -> None:
        self.world.kill(node)
        self.world.revive(node)
        self._collect()

    @rule(dt=st.sampled_from([0.5, 2.0, 25.0]))
    def advance(self, dt: float) -> None:
        self.world.advance(dt)
        self._collect()

    @invariant()
    def finished_only_when_handled_or_stored(self) -> None:
        fins = self.world.lines(b"FIN ")
        for line in fins[self.fins_checked :]:
            body = self.body_of[line[4:]]
            assert body in self.finished or body in self.stored, body
        self.fins_checked = len(fins)

    @invariant()
    def pending_dead_letters_are_known(self) -> None:
        assert self.world.coordinator.dead_letters_pending == len(self.world.dead_letters)

    def teardown(self) -> None:
        w = getattr(self, "world", None)
        if w is None:
            return
        # Report every dead letter as stored, answer what is held, and let nsqd time out
        # what died with a socket; then every body is finished, stored, or still on an nsqd.
        for _ in range(4):
            for d in w.dead_letters:
                self.stored.add(d.body)
                w.coordinator.dead_letter_published(d, w.now, "dead")
            w.dead_letters.clear()
            for d in self.held:
                if w.coordinator.finish(d, w.now):
                    self.finished.add(d.body)
            self.held.clear()
            w.pump()
            if self.pull:
                w.coordinator.fetch(4, w.now, expires=1.0)
                w.pump()
            w.advance(25.0)
            self._collect()
            self.finished_only_when_handled_or_stored()
        missing = self.published - self.finished - self.stored
        assert len(missing) <= w.server_depth() + w.server_in_flight(), missing


DeadLetterMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDeadLetters = DeadLetterMachine.TestCase
