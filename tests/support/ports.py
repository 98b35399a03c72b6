"""Addresses that refuse connections, for tests of what a client does when nothing listens."""

from __future__ import annotations

import socket

# Held for the rest of the test process: while a socket is bound to a port nothing else can
# bind it, and with no listen() a connection to it is refused at once.
_held: list[socket.socket] = []


def refused_address() -> str:
    """A loopback ``host:port`` that refuses every connection for the rest of the run.

    A port bound and released again is not enough under parallel tests: another test process
    can take it in between (one did, with an HTTP server), and the client meets that instead."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _held.append(sock)
    return f"127.0.0.1:{sock.getsockname()[1]}"
