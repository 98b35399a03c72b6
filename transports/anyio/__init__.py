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

from nsq_sansio.discovery import allow_nsqd
from nsq_sansio.errors import HTTPPublishError, NoNSQDAvailable
from transports._common import (
    ConnectionStats,
    ConsumerStats,
    DrainResult,
    ProducerStats,
    TLSOptions,
)

from .admin import LookupdAdmin, NSQDAdmin
from .consumer import Consumer, EventCallback, KeepaliveExpired, Message, drain_on_signals
from .http import HTTPProducer
from .producer import Producer, PublishObserver

__all__ = [
    "ConnectionStats",
    "Consumer",
    "ConsumerStats",
    "DrainResult",
    "EventCallback",
    "HTTPProducer",
    "HTTPPublishError",
    "KeepaliveExpired",
    "LookupdAdmin",
    "Message",
    "NSQDAdmin",
    "NoNSQDAvailable",
    "Producer",
    "ProducerStats",
    "PublishObserver",
    "TLSOptions",
    "allow_nsqd",
    "drain_on_signals",
]
