"""nsq-sansio: NSQ's protocol as pure state machines (bytes in, events out; no IO).

The client role (:class:`ClientConnection`) is re-exported here with its events and errors;
the consumer coordinator, discovery and the server role live in their own modules.
"""

from .connection import ClientConnection, ConnectionState
from .errors import (
    CompressionError,
    ConfigError,
    ConnectionLost,
    FrameTooLarge,
    IdentifyRejected,
    IncompatibleNSQD,
    InvalidName,
    LocalProtocolError,
    NSQError,
    ProtocolError,
    RemoteProtocolError,
    ServerError,
)
from .events import (
    AuthResult,
    CloseWait,
    ConnectionClosed,
    ConnectionReady,
    Event,
    Heartbeat,
    Message,
    MessageTakenBack,
    PublishAcknowledged,
    PublishFailed,
    ServerSettings,
    Subscribed,
    TLSUpgradeRequired,
)

__version__ = "0.1.0"

__all__ = [
    "AuthResult",
    "ClientConnection",
    "CloseWait",
    "CompressionError",
    "ConfigError",
    "ConnectionClosed",
    "ConnectionLost",
    "ConnectionReady",
    "ConnectionState",
    "Event",
    "FrameTooLarge",
    "Heartbeat",
    "IdentifyRejected",
    "IncompatibleNSQD",
    "InvalidName",
    "LocalProtocolError",
    "Message",
    "MessageTakenBack",
    "NSQError",
    "ProtocolError",
    "PublishAcknowledged",
    "PublishFailed",
    "RemoteProtocolError",
    "ServerError",
    "ServerSettings",
    "Subscribed",
    "TLSUpgradeRequired",
    "__version__",
]
