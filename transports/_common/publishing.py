"""What every producer shares, whatever its runtime: the checks of a publish's arguments (the
same exception for the same mistake on every producer, raised where the call was made), and
the bounded set of topic names already checked (so a publish does not re-check its topic, and
a producer publishing to ever new topics does not grow without end)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nsq_sansio.connection import check_deferred_delay
from nsq_sansio.errors import LocalProtocolError
from nsq_sansio.frames import encode_mpub, encode_pub
from nsq_sansio.names import validate_topic

from .arguments import check_seconds

__all__ = [
    "TOPICS_REMEMBERED",
    "PublishObserver",
    "check_batch",
    "check_deferred",
    "check_publish",
    "remember_topic",
]

#: ``publish_observer(topic, messages, seconds, error)``: called once per PUB/MPUB/DPUB when it
#: completes (``error`` is None on success), on the event loop or, blocking, on the thread that
#: read nsqd's answer; it must be quick and must not block.
PublishObserver = Callable[[str, int, float, "BaseException | None"], None]

#: The largest body a command's 4-byte size field can announce (frames refuses more).
_MAX_FRAMED = 0x7FFFFFFF

#: How many checked topic names a producer keeps; past it the set starts again empty.
TOPICS_REMEMBERED = 1024


def remember_topic(checked: set[str], topic: str) -> None:
    """Add ``topic`` (already validated) to ``checked``, starting again from an empty set once
    it holds :data:`TOPICS_REMEMBERED` names."""
    if len(checked) >= TOPICS_REMEMBERED:
        checked.clear()
    checked.add(topic)


def check_publish(checked: set[str], topic: str, body: bytes) -> None:
    """A PUB's arguments, checked where the caller made it: InvalidName for the topic,
    LocalProtocolError for a body that is not non-empty bytes (``checked`` skips the topic
    check for names seen before)."""
    if topic not in checked or type(body) is not bytes or not body:
        encode_pub(topic, body)
        remember_topic(checked, topic)


def check_batch(checked: set[str], topic: str, bodies: Sequence[bytes]) -> list[bytes]:
    """An MPUB's arguments, checked as :func:`check_publish` does; the bodies as a list. One
    body (bytes) instead of a sequence, an empty batch or one too big to frame:
    LocalProtocolError."""
    if isinstance(bodies, bytes | bytearray | str):
        encode_mpub(topic, bodies)  # raises: one body, not a list of them
    try:
        batch = list(bodies)
    except TypeError:
        raise LocalProtocolError(
            f"multi_publish needs a sequence of bodies (bytes), got {type(bodies).__name__}"
        ) from None
    if topic not in checked:
        validate_topic(topic)
        remember_topic(checked, topic)
    plain = bool(batch)
    for body in batch:
        if type(body) is not bytes or not body:
            plain = False
            break
    # Only a batch that is not plain non-empty bytes (or too big to frame) takes the full
    # encoder, which says what is wrong; the others are not encoded twice.
    if not plain or sum(map(len, batch)) + 4 * (len(batch) + 1) > _MAX_FRAMED:
        encode_mpub(topic, batch)
    return batch


def check_deferred(
    checked: set[str], topic: str, body: bytes, delay: float, max_req_timeout: float | None
) -> None:
    """A DPUB's arguments: those of a PUB, and a delay that is a finite number of seconds
    ``>= 0`` (LocalProtocolError otherwise) and not above nsqd's ``max_req_timeout`` (its
    default of an hour when None): DelayOutOfRange, however far above, for TCP and HTTP alike
    and before any connection is tried (a delay meant in milliseconds is the caller's
    mistake, whether nsqd is up or not)."""
    check_seconds("DPUB delay", delay)
    check_publish(checked, topic, body)
    check_deferred_delay(delay, max_req_timeout)
