"""trio transport: the anyio implementation, checked to run under trio.

The anyio transport is native on trio (anyio maps its tasks, cancel scopes and sockets onto
trio's own nurseries and streams), so there is one implementation to keep right; these
classes only make sure they are used inside ``trio.run`` and say so clearly otherwise::

    import trio
    from transports.trio import Consumer

    async def main() -> None:
        async with Consumer("events", "archive", nsqd=["127.0.0.1:4150"]) as c:
            async for msg in c:
                await msg.finish()

    trio.run(main)
"""

from __future__ import annotations

from typing import TypeVar

import sniffio

from nsq_sansio.admin import AdminRequest
from nsq_sansio.discovery import allow_nsqd
from nsq_sansio.errors import HTTPPublishError, LocalProtocolError, NoNSQDAvailable
from transports._common import (
    ConnectionStats,
    ConsumerStats,
    DrainResult,
    ProducerStats,
    TLSOptions,
)
from transports.anyio import admin as _admin
from transports.anyio import consumer as _consumer
from transports.anyio import http as _http
from transports.anyio import producer as _producer
from transports.anyio.consumer import EventCallback, KeepaliveExpired, Message, drain_on_signals
from transports.anyio.producer import PublishObserver

_T = TypeVar("_T")

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


def _require_trio(what: str) -> None:
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = "no event loop"
    if library != "trio":
        raise LocalProtocolError(
            f"transports.trio.{what} must run under trio.run() (found {library}); "
            "use transports.anyio for asyncio"
        )


class Consumer(_consumer.Consumer):
    """:class:`transports.anyio.Consumer`, checked to run under ``trio.run`` (elsewhere it
    raises ``LocalProtocolError``): its arguments, methods and guarantees are the same."""

    async def start(self) -> None:
        _require_trio("Consumer")
        await super().start()


class Producer(_producer.Producer):
    """:class:`transports.anyio.Producer`, checked to run under ``trio.run`` (elsewhere it
    raises ``LocalProtocolError``): its arguments, methods and guarantees are the same."""

    async def __aenter__(self) -> Producer:
        _require_trio("Producer")
        await super().__aenter__()
        return self


class HTTPProducer(_http.HTTPProducer):
    """:class:`transports.anyio.HTTPProducer`, checked to run under ``trio.run`` (elsewhere it
    raises ``LocalProtocolError``): its arguments, methods and guarantees are the same."""

    async def __aenter__(self) -> HTTPProducer:
        _require_trio("HTTPProducer")
        await super().__aenter__()
        return self


class NSQDAdmin(_admin.NSQDAdmin):
    """:class:`transports.anyio.NSQDAdmin`, checked to run under ``trio.run`` (elsewhere it
    raises ``LocalProtocolError``): its arguments, methods and answers are the same."""

    async def _call(self, request: AdminRequest[_T]) -> _T:
        _require_trio("NSQDAdmin")
        return await super()._call(request)


class LookupdAdmin(_admin.LookupdAdmin):
    """:class:`transports.anyio.LookupdAdmin`, checked to run under ``trio.run`` (elsewhere it
    raises ``LocalProtocolError``): its arguments, methods and answers are the same."""

    async def _call(self, request: AdminRequest[_T]) -> _T:
        _require_trio("LookupdAdmin")
        return await super()._call(request)
