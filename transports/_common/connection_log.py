"""Logging per connection: :class:`ConnectionLogger` puts the nsqd address in every record.

Each line a client logs about a connection starts with ``[host:port]`` and carries
``record.nsq_address``, so the lines of one nsqd can be told apart and filtered.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

__all__ = ["ConnectionLogger"]


class ConnectionLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefix every message with ``[address]`` and set ``record.nsq_address``.

    ``logger.with_address(addr)`` derives an adapter for another connection cheaply.
    """

    def __init__(self, logger: logging.Logger, address: str, **extra: Any) -> None:
        super().__init__(logger, {"nsq_address": address, **extra})
        self.address = address

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return f"[{self.address}] {msg}", kwargs

    def with_address(self, address: str) -> ConnectionLogger:
        extra = {k: v for k, v in (self.extra or {}).items() if k != "nsq_address"}
        return ConnectionLogger(self.logger, address, **extra)
