"""The consumer's lifecycle as a transition table (after h11's ``_state.py``).

Rules: the coordinator is in exactly one :class:`ConsumerState`; it changes only by
:meth:`Lifecycle.apply` with a :class:`LifecycleEvent`, and only along :data:`TRANSITIONS`;
an event the table does not list for the current state raises :class:`LifecycleError`
(naming both) and changes nothing. ``CLOSED`` and ``FAILED`` are final.
"""

from __future__ import annotations

import enum

from ..errors import LocalProtocolError

__all__ = ["TRANSITIONS", "ConsumerState", "Lifecycle", "LifecycleError", "LifecycleEvent"]


class ConsumerState(enum.Enum):
    """The coordinator's lifecycle."""

    CREATED = "created"
    RUNNING = "running"
    DRAINING = "draining"
    CLOSED = "closed"
    #: Stopped by an error reconnecting cannot cure (see :class:`ConsumerFailed`).
    FAILED = "failed"


class LifecycleEvent(enum.Enum):
    """What moves the consumer from one state to the next."""

    START = "start"  # start(): connect, poll lookupd
    DRAIN = "drain"  # drain(): stop the flow, give back, wait
    DRAINED = "drained"  # the last connection of a drain is gone
    FAIL = "fail"  # nsqd refused the configuration: stop for good


#: (state, event) -> the state it leads to. Nothing else moves the consumer.
TRANSITIONS: dict[tuple[ConsumerState, LifecycleEvent], ConsumerState] = {
    (ConsumerState.CREATED, LifecycleEvent.START): ConsumerState.RUNNING,
    (ConsumerState.CREATED, LifecycleEvent.DRAIN): ConsumerState.CLOSED,  # nothing to give back
    (ConsumerState.RUNNING, LifecycleEvent.DRAIN): ConsumerState.DRAINING,
    (ConsumerState.RUNNING, LifecycleEvent.FAIL): ConsumerState.FAILED,
    (ConsumerState.DRAINING, LifecycleEvent.DRAINED): ConsumerState.CLOSED,
}


class LifecycleError(LocalProtocolError):
    """An event the lifecycle table does not allow in the current state (a caller's bug)."""

    def __init__(self, state: ConsumerState, event: LifecycleEvent) -> None:
        super().__init__(
            f"{event.name} in state {state.name}: the lifecycle has no such transition"
        )
        self.state = state
        self.event = event


class Lifecycle:
    """The consumer's current state; :meth:`apply` is the only writer of :attr:`state`."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = ConsumerState.CREATED

    def apply(self, event: LifecycleEvent) -> ConsumerState:
        """Move along the table; :class:`LifecycleError` when it has no such transition."""
        try:
            new = TRANSITIONS[self.state, event]
        except KeyError:
            raise LifecycleError(self.state, event) from None
        self.state = new
        return new
