"""Blocking transport: NSQ consumer and producer over plain sockets and one IO thread.

::

    from transports.sync import Consumer, Producer

    with Producer("127.0.0.1:4150") as p:
        p.publish("events", b"hello")
"""

from __future__ import annotations

from .producer import NoNSQDAvailable, Producer
from .stats import ConnectionStats, ConsumerStats, NodeStats, ProducerStats

__all__ = [
    "ConnectionStats",
    "ConsumerStats",
    "NoNSQDAvailable",
    "NodeStats",
    "Producer",
    "ProducerStats",
]
