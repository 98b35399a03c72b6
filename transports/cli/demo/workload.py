"""What the demo publishes and how its handler behaves: :class:`DemoOptions` (the command's
settings) and :class:`Workload`, which numbers every message, encodes its sequence number,
publish time and deferral in the body, and decides deterministically which messages are
deferred, fail once, or always fail (the poison messages that must be given up).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BACKOFF_ATTEMPTS",
    "CHANNELS",
    "HEADER",
    "MIN_BODY_SIZE",
    "TOPIC",
    "DemoOptions",
    "Workload",
]


TOPIC = "demo"
CHANNELS = ("push", "pull")
HEADER = struct.Struct(">IdI")  # seq, publish time (time.monotonic()), defer in ms
MIN_BODY_SIZE = HEADER.size
#: Failures of an always-failing message up to this attempt ask for backoff.
BACKOFF_ATTEMPTS = 1


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """Everything the demo can be told; the command line maps onto it one to one."""

    messages: int = 200_000
    body_size: int = 100
    runtime: str = "asyncio"  # asyncio | trio | blocking
    compression: str = "none"  # none | snappy | deflate
    tls: bool = False
    max_in_flight: int = 1000
    batch: int = 100  # MPUB batch and fetch batch
    deferred_every: int = 100  # 1 message in N is published with DPUB (0: none)
    fail_per_mille: int = 10  # messages whose first attempt fails (requeued, no backoff)
    #: Messages that always fail (REQ with backoff) and are given up after max_attempts;
    #: None: one per 1,000 messages, between 1 and 10.
    give_ups: int | None = None
    max_attempts: int = 3
    timeout: float = 300.0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.messages < 1:
            raise ValueError(f"--messages must be >= 1, got {self.messages}")
        if self.messages >= 2**32:
            raise ValueError("--messages must be below 2**32")
        if self.body_size < MIN_BODY_SIZE:
            raise ValueError(f"--size must be >= {MIN_BODY_SIZE} bytes, got {self.body_size}")
        if self.runtime not in ("asyncio", "trio", "blocking"):
            raise ValueError(f"unknown runtime {self.runtime!r}")
        if self.compression not in ("none", "snappy", "deflate"):
            raise ValueError(f"unknown compression {self.compression!r}")
        if self.max_in_flight < 1 or self.batch < 1:
            raise ValueError("--max-in-flight and --batch must be >= 1")
        if not 0 <= self.fail_per_mille <= 1000:
            raise ValueError("--fail-per-mille must be between 0 and 1000")
        if self.max_attempts < 2:
            raise ValueError("--max-attempts must be >= 2 (failed messages are retried)")
        if self.give_ups is not None and self.give_ups < 0:
            raise ValueError("--give-ups must be >= 0")
        if self.timeout <= 0:
            raise ValueError("--timeout must be > 0")

    def client_options(self) -> dict[str, Any]:
        """Config fields shared by the demo's consumers."""
        return {
            "max_in_flight": self.max_in_flight,
            "max_attempts": self.max_attempts,
            "default_requeue_delay": 0.05,
            "max_requeue_delay": 1.0,
            "backoff_multiplier": 0.01,
            "max_backoff_duration": 0.2,
            "lookupd_poll_interval": 1.0,
            # In backoff only one connection holds RDY 1; with two nsqd the message to retry
            # may sit on the other one. Move RDY after 1 s of silence rather than go-nsq's 10 s.
            "low_rdy_idle_timeout": 1.0,
            "rdy_redistribute_interval": 0.25,
            "snappy": self.compression == "snappy",
            "deflate": self.compression == "deflate",
        }

    def producer_options(self) -> dict[str, Any]:
        return {
            "snappy": self.compression == "snappy",
            "deflate": self.compression == "deflate",
        }


# --- workload --------------------------------------------------------------------------------


class Workload:
    """Which messages exist, which are deferred, which fail: all derived from the sequence."""

    def __init__(self, options: DemoOptions) -> None:
        self.options = options
        self.count = options.messages
        self._pad = b"." * (options.body_size - MIN_BODY_SIZE)
        give_ups = options.give_ups
        if give_ups is None:
            give_ups = min(10, max(1, self.count // 1000))
        self.give_ups = min(give_ups, self.count)
        self.poison_every = self.count // self.give_ups if self.give_ups else 0

    def deferred_ms(self, seq: int) -> int:
        every = self.options.deferred_every
        if every and seq % every == every // 2:
            return 200 + (seq // every) % 9 * 100  # 0.2 .. 1.0 s
        return 0

    def is_poison(self, seq: int) -> bool:
        every = self.poison_every
        return bool(every) and seq % every == every - 1

    def wants_backoff(self, body: bytes, attempts: int) -> bool:
        """A failure that slows the consumer down (REQ with backoff): the first failure of an
        always-failing message. Its later failures, and the one-off failures, are retried
        without backoff, so the demo shows backoff without being dominated by it."""
        return attempts <= BACKOFF_ATTEMPTS and self.is_poison(HEADER.unpack_from(body)[0])

    def fails_first(self, seq: int) -> bool:
        return (seq * 2654435761 >> 8) % 1000 < self.options.fail_per_mille

    def body(self, seq: int, defer_ms: int = 0) -> bytes:
        return HEADER.pack(seq, time.monotonic(), defer_ms) + self._pad

    @staticmethod
    def parse(body: bytes) -> tuple[int, float, int]:
        return HEADER.unpack_from(body)

    def batches(self) -> Iterator[tuple[str, int, list[int]]]:
        """("mpub", 0, [seq...]) for immediate batches, ("dpub", delay_ms, [seq]) for deferred."""
        batch: list[int] = []
        size = self.options.batch
        for seq in range(self.count):
            defer = self.deferred_ms(seq)
            if defer:
                yield "dpub", defer, [seq]
                continue
            batch.append(seq)
            if len(batch) >= size:
                yield "mpub", 0, batch
                batch = []
        if batch:
            yield "mpub", 0, batch

    def expected_given_up(self) -> int:
        return self.give_ups

    def expected_deferred(self) -> int:
        return sum(1 for seq in range(self.count) if self.deferred_ms(seq))
