"""What a drain reports when it is over: :class:`DrainResult`, the same on every runtime.

``drain()`` returns it (asyncio, trio and blocking alike), so a program can tell a clean
shutdown from one whose deadline cut work short, and, on the blocking runtime, which of
``run()``'s handlers are still running in their threads (a thread cannot be cancelled).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DrainResult"]


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What a drain left undone; every field is empty when every message was answered in time.

    * ``requeued``: the ids of the messages user code still held at the drain's deadline. The
      drain requeued them (``REQ 0``), so nsqd delivers each again, maybe to another consumer;
      answering one now is too late (its ``taken_back`` turns True).
    * ``cancelled``: ``run()``'s handlers cancelled at the deadline (asyncio, trio), by the id
      of the message each was handling.
    * ``still_running``: ``run()``'s handlers still running when ``drain()`` returned (blocking:
      a thread cannot be cancelled), by the id of their message; what they answer now is
      ignored, and their threads end when the handlers return.
    """

    requeued: tuple[bytes, ...] = ()
    cancelled: tuple[bytes, ...] = ()
    still_running: tuple[bytes, ...] = ()

    @property
    def complete(self) -> bool:
        """True when every message was answered within the timeout and no handler was cut
        short or left running."""
        return not (self.requeued or self.cancelled or self.still_running)
