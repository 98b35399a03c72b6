"""Dead letters (:class:`DeadLetters`): the transport's report on a given-up message it was
asked to publish elsewhere.

The eighth layer of :class:`~nsq_sansio.consumer.ConsumerCoordinator`. With
``dead_letter=True`` a message delivered more than ``max_attempts`` times is not FIN'd by the
coordinator: it is held (as a message in user code is) and handed over as
:class:`~nsq_sansio.consumer.actions.DeadLetter`. The transport publishes it and reports:

* :meth:`~DeadLetters.dead_letter_published`: stored on the dead-letter topic; now it is
  FIN'd and a :class:`~nsq_sansio.consumer.actions.GiveUp` names the topic. With
  ``topic=None`` (a routing function chose no destination) it is FIN'd and given up as a
  consumer without dead letters does.
* :meth:`~DeadLetters.dead_letter_failed`: not stored; it is requeued (REQ with the usual
  delay, without backoff), delivered again later, and dead-lettered again then.

So a given-up message is FIN'd only after the publish succeeded: never lost. A message may
reach the dead-letter topic twice (at least once), when nsqd timed it out or the connection
closed while the publish ran (the late FIN is then a :class:`TakenBack`).
"""

from __future__ import annotations

from ..backoff import Outcome
from ..errors import LocalProtocolError
from .actions import Deliver, GiveUp
from .answers import Answers
from .state import ConsumerState

__all__ = ["DeadLetters"]


class DeadLetters(Answers):
    """Reports on :class:`~nsq_sansio.consumer.actions.DeadLetter` actions (see the module
    docstring)."""

    @property
    def dead_letters_pending(self) -> int:
        """How many DeadLetter actions wait for the transport's report."""
        return len(self._dead_letters)

    def _take_dead_letter(self, delivery: Deliver) -> None:
        """Forget ``delivery`` as a pending dead letter; LocalProtocolError if it never was
        one (reporting on a message the coordinator did not hand over is a transport bug)."""
        if self._dead_letters.pop(id(delivery), None) is delivery:
            return
        raise LocalProtocolError(
            f"message {delivery.id!r} was not handed over as a DeadLetter, or was reported on"
        )

    def dead_letter_published(self, delivery: Deliver, now: float, topic: str | None) -> bool:
        """The DeadLetter ``delivery`` was published to ``topic`` (None: to nothing, the
        routing chose none): FIN it and report :class:`GiveUp`. False (and a TakenBack) when
        it was no longer ours: nsqd will deliver it again."""
        self._take_dead_letter(delivery)
        link = self._settle(delivery, "FIN")
        if link is None:
            return False
        assert link.proto is not None
        message_id = delivery[1]
        if not link.proto.is_in_flight(message_id):  # already answered in the same read
            self._report_gone(delivery, "FIN")
            return False
        link.proto.finish(message_id)
        self.given_up += 1
        if topic is not None:
            self.dead_lettered += 1
        self._actions.append(GiveUp(link.conn_id, link.address, delivery.message, topic))
        if self._state is ConsumerState.RUNNING and self._backoff.record(Outcome.NEUTRAL, now):
            self._recalm()
            self._rebalance(now)
        self._after_answer(link, Outcome.NEUTRAL, now, delivery, recorded=True)
        return True

    def dead_letter_failed(self, delivery: Deliver, now: float) -> bool:
        """The DeadLetter ``delivery`` could not be published: requeue it (the automatic
        delay, no backoff) so it comes back and is dead-lettered again. False (and a
        TakenBack) when it was no longer ours: nsqd requeues it by itself."""
        self._take_dead_letter(delivery)
        self.dead_letter_failures += 1
        return self.requeue(delivery, now, backoff=False)
