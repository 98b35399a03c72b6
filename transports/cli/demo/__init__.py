"""``nsq-sansio demo``: the whole library at work, in one process, with exact accounting.

An embedded nsqlookupd and two embedded nsqd start in-process. A workload (default 200,000
messages of 100 bytes, about 1% of them deferred) is published across both nsqd while two
channels consume the topic:

* ``push``: two concurrent push consumers (``async for msg in consumer`` / ``for msg in c``);
* ``pull``: one pull consumer (``fetch(batch, timeout)``).

The handler fails a small, deterministic share of messages: ~1% fail once (requeued without
backoff, they succeed on the next attempt) and a few (``--give-ups``, 1 per 1,000 up to 10)
always fail: their first failure asks for backoff, and after ``max_attempts`` deliveries
they are given up. Every message carries its sequence number, its publish time
and its deferral, so at the end each channel is checked message by message:

* every sequence number is either finished or given up (never both, never neither);
* a message handled successfully twice is a *redelivery* when the later delivery has a higher
  attempt count (nsqd took it back after a timeout: at-least-once, not a loss) and a
  *duplicate* otherwise; duplicates must be 0;
* exactly the poison messages are given up.

The exit code is 0 only when every message is accounted for on both channels. The run is
bounded (``--timeout``); consumers are drained on the way out.

Runtimes: ``asyncio`` and ``trio`` (the anyio transport, broker in the same event loop) and
``blocking`` (the threaded transport, broker on a background thread).

The package: :mod:`.workload` (options and the deterministic workload), :mod:`.accounting`
(per-message accounting and the steps every runner shares), :mod:`.report` (progress, result,
table), :mod:`.run_async` and :mod:`.run_blocking` (the runtimes), :mod:`.spark` (``--spark``),
:mod:`.command` (the command line).
"""

from __future__ import annotations

from .accounting import ChannelTally, Tally
from .command import build_parser, demo_main, run_demo
from .report import DemoResult, Progress, format_report
from .workload import DemoOptions, Workload

__all__ = [
    "ChannelTally",
    "DemoOptions",
    "DemoResult",
    "Progress",
    "Tally",
    "Workload",
    "build_parser",
    "demo_main",
    "format_report",
    "run_demo",
]
