"""The server roles of the protocol, pure like the client side: nsqd (``nsqd.py``) and
nsqlookupd (``lookupd.py``). Transports in ``transports/embedded`` put sockets around them.

nsqd's role is split the way nsqd's Go source is: ``protocol_v2.py`` (the commands),
``identify.py``, ``client.py``, ``topic.py``, ``channel.py`` (queue, in-flight and deferred
heaps), ``topics.py`` (creation and deletion), ``message.py``, with ``nsqd.py``'s :class:`NSQD`
composing them and answering the HTTP API; ``context.py`` is what they share and ``wire.py``
the frame vocabulary."""

from __future__ import annotations

from .backend import (
    Backend,
    BackendError,
    BackendFactory,
    BackendRecord,
    DiscardBackend,
    MemoryBackend,
    backend_name,
    decode_record,
    encode_record,
    memory_backend_factory,
)
from .events import (
    AdminError,
    AuthRequested,
    ChannelCreated,
    ChannelDeleted,
    CloseConnection,
    LookupChannels,
    RegistryEvent,
    ServerEvent,
    StartTLS,
    TopicCreated,
    TopicDeleted,
)
from .nsqd import NSQD, ClientState, ConnectionId, NSQDState
from .options import AuthCheck, Authorization, AuthRequest, AuthState, NSQDOptions

__all__ = [
    "NSQD",
    "AdminError",
    "AuthCheck",
    "AuthRequest",
    "AuthRequested",
    "AuthState",
    "Authorization",
    "Backend",
    "BackendError",
    "BackendFactory",
    "BackendRecord",
    "ChannelCreated",
    "ChannelDeleted",
    "ClientState",
    "CloseConnection",
    "ConnectionId",
    "DiscardBackend",
    "LookupChannels",
    "MemoryBackend",
    "NSQDOptions",
    "NSQDState",
    "RegistryEvent",
    "ServerEvent",
    "StartTLS",
    "TopicCreated",
    "TopicDeleted",
    "backend_name",
    "decode_record",
    "encode_record",
    "memory_backend_factory",
]
