"""A client connection's lifecycle as a table: (state, what happened) -> next state.

Every state change of :class:`~nsq_sansio.connection.ClientConnection` goes through
:func:`next_state`, so the moves below are all the moves there are::

    IDENTIFYING -> [TLS_HANDSHAKE -> AWAITING_TLS_OK] -> [AWAITING_COMPRESSION_OK]
        -> [AUTHENTICATING] -> READY -> SUBSCRIBING -> SUBSCRIBED -> CLOSING -> CLOSED

(any state but CLOSED goes to CLOSED when the connection fails or is closed at once). This
module also says which states allow which commands, and what a pending answer answers.
"""

from __future__ import annotations

from enum import Enum

from .errors import LocalProtocolError

__all__ = [
    "HANDSHAKE_STATES",
    "INITIAL_STATE",
    "MESSAGE_STATES",
    "PUBLISH_STATES",
    "TRANSITIONS",
    "Awaiting",
    "ConnectionState",
    "Lifecycle",
    "next_state",
]


class ConnectionState(Enum):
    """Where a client connection is in its lifecycle."""

    IDENTIFYING = "IDENTIFYING"
    TLS_HANDSHAKE = "TLS_HANDSHAKE"
    AWAITING_TLS_OK = "AWAITING_TLS_OK"
    AWAITING_COMPRESSION_OK = "AWAITING_COMPRESSION_OK"
    AUTHENTICATING = "AUTHENTICATING"
    READY = "READY"
    SUBSCRIBING = "SUBSCRIBING"
    SUBSCRIBED = "SUBSCRIBED"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"


class Lifecycle(Enum):
    """What moves a connection from one state to the next."""

    #: nsqd's IDENTIFY answer enabled TLS: the next bytes are the TLS handshake.
    TLS_NEGOTIATED = "TLS_NEGOTIATED"
    #: The transport finished the TLS handshake; nsqd's OK comes over TLS.
    TLS_ESTABLISHED = "TLS_ESTABLISHED"
    #: snappy or deflate was negotiated: both directions switch, nsqd's OK comes compressed.
    COMPRESSION_NEGOTIATED = "COMPRESSION_NEGOTIATED"
    #: The upgrades are done and nsqd requires AUTH: it was sent.
    AUTH_SENT = "AUTH_SENT"
    #: The upgrades are done and nsqd requires no AUTH.
    NEGOTIATED = "NEGOTIATED"
    #: nsqd accepted the AUTH secret.
    AUTHENTICATED = "AUTHENTICATED"
    #: ``SUB`` was queued.
    SUB_SENT = "SUB_SENT"
    #: nsqd answered ``SUB`` with OK: messages may come.
    SUB_OK = "SUB_OK"
    #: ``CLS`` was queued: nsqd answers CLOSE_WAIT, in-flight messages can still be answered.
    CLS_SENT = "CLS_SENT"
    #: The connection failed, nsqd closed it, or the client closed it at once.
    CLOSED = "CLOSED"


_S = ConnectionState
_L = Lifecycle
#: States where the upgrades may be over (what comes after depends on nsqd's answers).
_UPGRADE_ENDS = (_S.IDENTIFYING, _S.AWAITING_TLS_OK, _S.AWAITING_COMPRESSION_OK)

#: Every move a connection makes.
TRANSITIONS: dict[tuple[ConnectionState, Lifecycle], ConnectionState] = {
    (_S.IDENTIFYING, _L.TLS_NEGOTIATED): _S.TLS_HANDSHAKE,
    (_S.TLS_HANDSHAKE, _L.TLS_ESTABLISHED): _S.AWAITING_TLS_OK,
    (_S.IDENTIFYING, _L.COMPRESSION_NEGOTIATED): _S.AWAITING_COMPRESSION_OK,
    (_S.AWAITING_TLS_OK, _L.COMPRESSION_NEGOTIATED): _S.AWAITING_COMPRESSION_OK,
    **{(state, _L.AUTH_SENT): _S.AUTHENTICATING for state in _UPGRADE_ENDS},
    **{(state, _L.NEGOTIATED): _S.READY for state in _UPGRADE_ENDS},
    (_S.AUTHENTICATING, _L.AUTHENTICATED): _S.READY,
    (_S.READY, _L.SUB_SENT): _S.SUBSCRIBING,
    (_S.SUBSCRIBING, _L.SUB_OK): _S.SUBSCRIBED,
    (_S.SUBSCRIBED, _L.CLS_SENT): _S.CLOSING,
    **{(state, _L.CLOSED): _S.CLOSED for state in _S if state is not _S.CLOSED},
}

INITIAL_STATE = _S.IDENTIFYING


def next_state(state: ConnectionState, event: Lifecycle) -> ConnectionState:
    """The state ``event`` moves a connection in ``state`` to; a move not in
    :data:`TRANSITIONS` raises :class:`~nsq_sansio.errors.LocalProtocolError`."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise LocalProtocolError(
            f"{event.name} is not a move of a connection in state {state.name}"
        ) from None


#: States that allow PUB, MPUB and DPUB.
PUBLISH_STATES = frozenset({_S.READY, _S.SUBSCRIBING, _S.SUBSCRIBED})
#: States where messages may be in flight (FIN, REQ, TOUCH).
MESSAGE_STATES = frozenset({_S.SUBSCRIBED, _S.CLOSING})
#: States before READY: frames are answers to the handshake, bounded in size.
HANDSHAKE_STATES = frozenset(
    {_S.IDENTIFYING, _S.AWAITING_TLS_OK, _S.AWAITING_COMPRESSION_OK, _S.AUTHENTICATING}
)


class Awaiting(Enum):
    """What a pending response answers (responses come back in command order)."""

    IDENTIFY = 0
    TLS_OK = 1
    COMPRESSION_OK = 2
    AUTH = 3
    SUB = 4
    PUBLISH = 5
    CLS = 6
    PUBLISH_GROUP = 7  # PUBs coalesced into one MPUB: one answer for consecutive request ids
