"""Logging per connection: :class:`ConnectionLogger` puts the peer's address in every record.

Each line a client logs about a connection starts with ``[host:port]`` and carries
``record.nsq_address`` (``record.nsq_lookupd`` for an nsqlookupd), so the lines of one nsqd can
be told apart and filtered; fixed facts (a consumer's topic and channel) ride along too.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

__all__ = ["ConnectionLogger"]


class ConnectionLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefix every message with ``[address]`` and set ``record.nsq_address`` (or the
    attribute ``field`` names), plus the ``extra`` facts given here, on every record.

    ``logger.with_address(addr)`` derives an adapter for another connection cheaply.
    """

    def __init__(
        self, logger: logging.Logger, address: str, *, field: str = "nsq_address", **extra: Any
    ) -> None:
        super().__init__(logger, {field: address, **extra})
        self.address = address
        self.field = field

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return f"[{self.address}] {msg}", kwargs

    def with_address(self, address: str) -> ConnectionLogger:
        extra = {k: v for k, v in (self.extra or {}).items() if k != self.field}
        return ConnectionLogger(self.logger, address, field=self.field, **extra)
