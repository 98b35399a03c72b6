"""CPython's cyclic garbage collector while a streaming source runs: a higher first threshold.

A source holds a whole micro-batch in flight (a ``Message`` and its ``Deliver`` handle per
message, both tracked by the collector) until Spark commits it. With CPython's default
thresholds (700, 10, 10) the allocations of reading the next batch trigger a full collection
every few tens of thousands of messages, and each one walks every message held: measured on a
real nsqd with batches of 100,000, 1.2 to 1.8 CPU-seconds of collection per 1M messages, about
half of the source's CPU. A first threshold of 50,000 makes full collections rare (the young
collections cost the same per object whatever the threshold) and leaves cyclic garbage at most
that many allocations longer. The source's driver process is Spark's own Python process for
this source, so the setting touches nothing else there; it is put back when the last source of
the process stops (option ``gc_threshold``; 0 leaves the collector alone).
"""

from __future__ import annotations

import gc
import threading

__all__ = ["raise_threshold", "restore_threshold"]

_lock = threading.Lock()
_users = 0
_saved: tuple[int, int, int] | None = None
_set: tuple[int, int, int] | None = None


def raise_threshold(threshold0: int) -> bool:
    """Raise the collector's first threshold to ``threshold0`` (never lower it; 0: leave it
    alone) until the matching :func:`restore_threshold`. True when this call counts as a user
    (call :func:`restore_threshold` once then)."""
    global _users, _saved, _set
    if threshold0 <= 0:
        return False
    with _lock:
        _users += 1
        if _users == 1:
            current = gc.get_threshold()
            # 0 disables collection: whoever did it meant it; a higher one stays as is.
            if 0 < current[0] < threshold0:
                _saved = current
                _set = (threshold0, current[1], current[2])
                gc.set_threshold(*_set)
        return True


def restore_threshold() -> None:
    """One user of :func:`raise_threshold` is done; the last one puts the thresholds back
    (unless something else changed them meanwhile)."""
    global _users, _saved, _set
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            if _saved is not None and gc.get_threshold() == _set:
                gc.set_threshold(*_saved)
            _saved = _set = None
