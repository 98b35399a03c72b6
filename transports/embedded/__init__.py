"""Embedded NSQ servers (nsqd and nsqlookupd) over anyio sockets, for tests and demos.

``EmbeddedNSQD`` and ``EmbeddedLookupd`` are async context managers (asyncio or trio);
``Cluster`` starts a lookupd and N nsqds registered with it; ``ServerThread`` runs any of
them on a background thread for blocking code. A server that cannot start raises one plain
exception naming the cause: ``ListenError`` (an address in use...), ``TLSFileError`` (a
certificate that cannot be loaded), ``ConfigError`` (options nsqd would refuse).
"""

from __future__ import annotations

from .cluster import Cluster
from .errors import ListenError, TLSFileError
from .lookupd import EmbeddedLookupd
from .nsqd import EmbeddedNSQD
from .thread import ServerThread

__all__ = [
    "Cluster",
    "EmbeddedLookupd",
    "EmbeddedNSQD",
    "ListenError",
    "ServerThread",
    "TLSFileError",
]
