"""RDY arithmetic: an alias of :mod:`nsq_sansio.consumer.rdy`, where it lives beside the
coordinator it serves (kept so that ``nsq_sansio.rdy`` imports go on working)."""

from __future__ import annotations

from .consumer.rdy import STARVED_RATIO, even_shares, is_starved, needs_refresh

__all__ = ["STARVED_RATIO", "even_shares", "is_starved", "needs_refresh"]
