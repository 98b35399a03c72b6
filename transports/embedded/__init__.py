"""Embedded NSQ servers (nsqd and nsqlookupd) over anyio sockets, for tests and demos."""

from __future__ import annotations

from .lookupd import EmbeddedLookupd
from .thread import ServerThread

__all__ = ["EmbeddedLookupd", "ServerThread"]
