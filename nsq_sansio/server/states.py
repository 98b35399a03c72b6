"""The states a client connection and an nsqd node go through (the enums only).

They sit apart from the classes that hold them so that a channel can ask whether a client is
subscribed without importing the client module, which itself refers to channels.
"""

from __future__ import annotations

import enum

__all__ = ["STATS_STATE", "ClientState", "NSQDState"]


class ClientState(enum.Enum):
    """Where one client connection is in protocol V2."""

    AWAITING_MAGIC = "awaiting_magic"  # connected; the 4-byte "  V2" has not arrived yet
    INIT = "init"  # may IDENTIFY, AUTH, PUB, SUB
    TLS_HANDSHAKE = "tls_handshake"  # IDENTIFY negotiated TLS; waiting for tls_established()
    AUTHENTICATING = "authenticating"  # AUTH asked of the transport; waiting for auth_result()
    SUBSCRIBED = "subscribed"  # SUB done: RDY/FIN/REQ/TOUCH/CLS
    CLOSING = "closing"  # CLS received: no more messages, FIN/REQ/TOUCH still allowed
    CLOSED = "closed"  # the core is done with it; the transport closes the socket


#: nsqd's numbers for client states, as /stats reports them.
STATS_STATE = {
    ClientState.AWAITING_MAGIC: 0,
    ClientState.INIT: 0,
    ClientState.TLS_HANDSHAKE: 0,
    ClientState.AUTHENTICATING: 0,
    ClientState.SUBSCRIBED: 3,
    ClientState.CLOSING: 4,
    ClientState.CLOSED: 1,
}


class NSQDState(enum.Enum):
    """The node's own lifecycle."""

    RUNNING = "running"
    CLOSED = "closed"
