"""anyio transport: runs on asyncio and on trio.

::

    from transports.anyio import Consumer, Producer

    async with Consumer("events", "archive", lookupd=["http://127.0.0.1:4161"],
                        max_in_flight=200) as c:
        async for msg in c:
            await handle(msg.body)
            await msg.finish()
"""

from __future__ import annotations

from transports._common import (
    ConnectionStats,
    ConsumerStats,
    HTTPPublishError,
    ProducerStats,
    TLSOptions,
)

from .admin import LookupdAdmin, NSQDAdmin
from .consumer import Consumer, KeepaliveExpired, Message, drain_on_signals
from .http import HTTPProducer
from .producer import NoNSQDAvailable, Producer

__all__ = [
    "ConnectionStats",
    "Consumer",
    "ConsumerStats",
    "HTTPProducer",
    "HTTPPublishError",
    "KeepaliveExpired",
    "LookupdAdmin",
    "Message",
    "NSQDAdmin",
    "NoNSQDAvailable",
    "Producer",
    "ProducerStats",
    "TLSOptions",
    "drain_on_signals",
]
