"""Blocking transport: NSQ consumer and producer over plain sockets and one IO thread.

::

    from transports.sync import Consumer, Producer

    with Producer("127.0.0.1:4150") as p:
        p.publish("events", b"hello")
"""

from __future__ import annotations

from transports._common import ConnectionStats, ConsumerStats, ProducerStats, TLSOptions

from .http import HTTPProducer, HTTPPublishError
from .producer import NoNSQDAvailable, Producer

__all__ = [
    "ConnectionStats",
    "ConsumerStats",
    "HTTPProducer",
    "HTTPPublishError",
    "NoNSQDAvailable",
    "Producer",
    "ProducerStats",
    "TLSOptions",
]
