"""Embedded NSQ servers (nsqd and nsqlookupd) over anyio sockets, for tests and demos.

``EmbeddedNSQD`` and ``EmbeddedLookupd`` are async context managers (asyncio or trio);
``Cluster`` starts a lookupd and N nsqds registered with it; ``ServerThread`` runs any of
them on a background thread for blocking code.
"""

from __future__ import annotations

from .cluster import Cluster
from .lookupd import EmbeddedLookupd
from .nsqd import EmbeddedNSQD
from .thread import ServerThread

__all__ = ["Cluster", "EmbeddedLookupd", "EmbeddedNSQD", "ServerThread"]
