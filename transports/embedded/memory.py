"""The ``memory`` block of ``/stats``: nsqd reports Go runtime figures; an embedded nsqd fills the
same keys with this Python process's nearest equivalents (allocated blocks, resident set, GC
pauses recorded by a ``gc`` callback, collections).
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
from collections import deque
from typing import Any

__all__ = ["install_gc_pause_recorder", "memory_stats"]


# GC pauses of this process (microseconds), for /stats' memory block; the callback is
# installed once, by the first embedded nsqd that starts.
_GC_PAUSES: deque[int] = deque(maxlen=256)
_gc_started = 0.0


def _record_gc_pause(phase: str, info: dict[str, Any]) -> None:
    global _gc_started
    if phase == "start":
        _gc_started = time.perf_counter()
    elif _gc_started:
        _GC_PAUSES.append(int((time.perf_counter() - _gc_started) * 1_000_000))


def install_gc_pause_recorder() -> None:
    if _record_gc_pause not in gc.callbacks:
        gc.callbacks.append(_record_gc_pause)


def _percentile(sorted_values: list[int], fraction: float) -> int:
    if not sorted_values:
        return 0
    index = min(len(sorted_values) - 1, max(0, math.ceil(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def memory_stats() -> dict[str, int]:
    """``/stats``' ``memory`` block: nsqd's keys (Go runtime figures) filled with this
    Python process's nearest equivalents: allocated blocks for ``heap_objects``, the
    resident set for ``heap_in_use_bytes``, the recent GC pauses and the number of
    collections; ``heap_idle_bytes``, ``heap_released_bytes`` and ``next_gc_bytes`` have no
    CPython counterpart and are 0."""
    pauses = sorted(_GC_PAUSES)
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": _resident_bytes(),
        "heap_released_bytes": 0,
        "gc_pause_usec_100": _percentile(pauses, 1.0),
        "gc_pause_usec_99": _percentile(pauses, 0.99),
        "gc_pause_usec_95": _percentile(pauses, 0.95),
        "next_gc_bytes": 0,
        "gc_total_runs": sum(generation["collections"] for generation in gc.get_stats()),
    }


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        try:
            import resource

            # ru_maxrss is the peak, in KiB on Linux (bytes on macOS): a fallback only
            return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        except (ImportError, OSError):
            return 0
