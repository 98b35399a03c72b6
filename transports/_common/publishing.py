"""What every producer shares, whatever its runtime: the error raised when no nsqd took a
publish, and the bounded set of topic names already checked (so a publish does not re-check
its topic, and a producer publishing to ever new topics does not grow without end)."""

from __future__ import annotations

from collections.abc import Sequence

from nsq_sansio.errors import NSQError

__all__ = ["TOPICS_REMEMBERED", "NoNSQDAvailable", "remember_topic"]

#: How many checked topic names a producer keeps; past it the set starts again empty.
TOPICS_REMEMBERED = 1024


class NoNSQDAvailable(NSQError):
    """No nsqd of the pool took the publish: each was down, refused the connection or closed
    it before answering, or the deadline passed first. ``errors`` says why, node by node,
    when the producer kept them (the message always says it)."""

    def __init__(self, errors: Sequence[BaseException] = (), *, message: str | None = None) -> None:
        if message is None:
            detail = "; ".join(str(e) for e in errors) or "no nsqd configured"
            message = f"no nsqd could take the publish: {detail}"
        super().__init__(message)
        self.errors = tuple(errors)


def remember_topic(checked: set[str], topic: str) -> None:
    """Add ``topic`` (already validated) to ``checked``, starting again from an empty set once
    it holds :data:`TOPICS_REMEMBERED` names."""
    if len(checked) >= TOPICS_REMEMBERED:
        checked.clear()
    checked.add(topic)
