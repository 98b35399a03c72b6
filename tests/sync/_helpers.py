"""Helpers for the blocking transport's integration tests (the shared ones live in
``support.brokers``)."""

from __future__ import annotations

from typing import Any

from support.brokers import find_channel, running_cluster, running_nsqd, unique, wait_for

from transports.embedded import EmbeddedNSQD, ServerThread

__all__ = ["channel_stats", "running_cluster", "running_nsqd", "unique", "wait_for"]


def channel_stats(
    runner: ServerThread[EmbeddedNSQD], topic: str, channel: str
) -> dict[str, Any] | None:
    """The broker's own view of a channel (in_flight_count, depth...), read on its loop."""
    server = runner.server
    return runner.call(
        lambda: find_channel(
            server.core.stats(server.now(), topic=topic, channel=channel), topic, channel
        )
    )
