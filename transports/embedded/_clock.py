"""The clock of the event loop an embedded server runs on, readable from any thread.

The pure cores take ``now`` in the server loop's own clock (``anyio.current_time()`` there).
Callers on another thread or loop must not pass *their* ``anyio.current_time()``: trio's
clock has a large random offset from asyncio's (``time.monotonic()``), so a registration
would look hours old, or in the future. :meth:`LoopClock.now` gives the server's time from
anywhere.
"""

from __future__ import annotations

import threading
import time

import anyio

__all__ = ["LoopClock"]


class LoopClock:
    """Bound (:meth:`bind`) inside the server's running loop; :meth:`now` from any thread."""

    def __init__(self) -> None:
        self._thread: int | None = None
        self._offset = 0.0

    def bind(self) -> None:
        """Record the running loop's clock; call from inside it (the server's ``start``)."""
        self._thread = threading.get_ident()
        self._offset = anyio.current_time() - time.monotonic()

    def on_loop_thread(self) -> bool:
        """True when called on the thread that runs the server's loop."""
        return self._thread == threading.get_ident()

    def now(self) -> float:
        """The server loop's ``current_time()``, whichever thread or loop asks."""
        if self._thread is None:
            raise RuntimeError("the server is not running")
        if self._thread == threading.get_ident():
            try:
                return anyio.current_time()  # exact, and right under a mock clock too
            except Exception:  # not inside the loop (a plain callback): use the offset
                pass
        return time.monotonic() + self._offset
