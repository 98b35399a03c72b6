"""The OpenTelemetry semantic conventions this package uses (messaging, server, error), by name.

Spelled out here rather than imported from ``opentelemetry-semantic-conventions``: the
messaging names are still in its incubating (development) part, and the library depends on
``opentelemetry-api`` only. ``messaging.system`` is ``"nsq"``, which the conventions' registry
does not list (a value outside the list is allowed); NSQ's own attributes are under
``messaging.nsq.*`` and NSQ's own instruments under ``nsq.*``, as the conventions ask of
system-specific names.
"""

from __future__ import annotations

SYSTEM = "nsq"

# --- attributes ---------------------------------------------------------------------------------

MESSAGING_SYSTEM = "messaging.system"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_CONSUMER_GROUP_NAME = "messaging.consumer.group.name"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_BATCH_MESSAGE_COUNT = "messaging.batch.message_count"
MESSAGING_CLIENT_ID = "messaging.client.id"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
NETWORK_IO_DIRECTION = "network.io.direction"

#: How many times nsqd has delivered the message (1 the first time).
NSQ_MESSAGE_ATTEMPTS = "messaging.nsq.message.attempts"
#: A DPUB's or REQ's delay, seconds.
NSQ_MESSAGE_DELAY = "messaging.nsq.message.delay"
#: The quantile of an end-to-end latency nsqd measures (``"0.99"``).
NSQ_LATENCY_QUANTILE = "messaging.nsq.latency.quantile"

# --- operation types (messaging.operation.type) -------------------------------------------------

SEND = "send"
RECEIVE = "receive"
PROCESS = "process"
SETTLE = "settle"

# --- metrics ------------------------------------------------------------------------------------

CLIENT_OPERATION_DURATION = "messaging.client.operation.duration"
CLIENT_SENT_MESSAGES = "messaging.client.sent.messages"
CLIENT_CONSUMED_MESSAGES = "messaging.client.consumed.messages"
PROCESS_DURATION = "messaging.process.duration"

#: The conventions' advisory bucket boundaries for both duration histograms (seconds).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
