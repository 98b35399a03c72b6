"""Blocking transport: NSQ consumer and producer over plain sockets and one IO thread.

::

    from transports.sync import Consumer, Producer

    with Producer("127.0.0.1:4150") as p:
        p.publish("events", b"hello")
"""

from __future__ import annotations

from transports._common import ConnectionStats, ConsumerStats, ProducerStats, TLSOptions

from .consumer import Consumer, EventCallback, KeepaliveExpired, Message
from .http import HTTPProducer, HTTPPublishError
from .producer import NoNSQDAvailable, Producer
from .signals import drain_on_signals

__all__ = [
    "ConnectionStats",
    "Consumer",
    "ConsumerStats",
    "EventCallback",
    "HTTPProducer",
    "HTTPPublishError",
    "KeepaliveExpired",
    "Message",
    "NoNSQDAvailable",
    "Producer",
    "ProducerStats",
    "TLSOptions",
    "drain_on_signals",
]
