"""The consumer coordinator: many nsqd connections, one decision maker, no IO.

A transport drives one :class:`ConsumerCoordinator` and does exactly what it says::

    coordinator.start(now)                       # connect / ask lookupd
    loop:
        for action in coordinator.take_actions(): # Connect, CloseConnection, StartTLS,
            ...                                   # SendHTTPRequest, CloseHTTPRequest, Deliver,
                                                  # GiveUp, TakenBack, BackoffChanged,
                                                  # FetchResult, DrainComplete, ConsumerFailed
        for conn_id, data in coordinator.pending_data():
            write(conn_id, data)
        sleep until coordinator.next_deadline() or IO, then feed one of:
            connection_made(conn_id, now) / connection_failed(conn_id, error, now)
            receive_data(conn_id, data, now)  (b"" at EOF) / tls_established(conn_id, now)
            http_data(request_id, data, now) (b"" at EOF) / http_response(...) / http_failed(...)
            handle_timer(now)
        dead letters: dead_letter_published(d, now, topic) / dead_letter_failed(d, now)
        user code: finish(d, now) / requeue(d, now, delay=None, backoff=True) / touch(d, now)
                   set_max_in_flight(n, now) / fetch(...) / drain(now, unseen=queue)
        transport (optional): mark_delivered(d) when a Deliver reaches user code;
                   finish_many(ds, now) for FINs it collected (the cheapest way to answer)

What it decides (NSQ's client guide, every line of it; see docs/consumer.md):

* RDY: a new connection starts at RDY 1; ``max_in_flight`` is then spread evenly
  (``max_in_flight // n``, remainder given out, capped by each nsqd's ``max_rdy_count``). The
  messages held, over all connections, never exceed ``max_in_flight`` (not only the sum of
  RDY): a raise only uses budget not in flight elsewhere, counting what a lowered RDY may
  still bring (see :mod:`~nsq_sansio.consumer.ledger`). RDY is re-sent when a connection's
  count left is 0 or under 25% of the last value. With fewer RDY than connections, RDY 1 goes
  to a random set and moves away from connections idle for ``low_rdy_idle_timeout``.
  ``set_max_in_flight`` (0 pauses) redistributes at once. :meth:`ConsumerCoordinator.is_starved`
  is the guide's.
* Messages: attempts over ``max_attempts`` are FIN'd and reported (:class:`GiveUp`), or, with
  ``dead_letter=True``, handed to the transport to publish first (:class:`DeadLetter`, then
  ``dead_letter_published`` FINs it or ``dead_letter_failed`` requeues it); REQ without
  a delay waits ``default_requeue_delay * attempts`` capped; late FIN/REQ/TOUCH is reported as
  :class:`TakenBack`, never raised. Each :class:`Deliver` has a deadline; TOUCH extends it up to
  the server's ``max_msg_timeout``.
* Backoff (:mod:`nsq_sansio.backoff`): RDY 0 everywhere, wait, then one message at a time to
  test (RDY: what the test connection holds, plus one), one result per window; a give-up
  counts as a success, a message failing again does not raise the level. Every change is
  reported (:class:`BackoffChanged`).
* Discovery (:mod:`nsq_sansio.discovery`): lookupd mode connects to new nodes found by a poll
  and reconnects a lost node only when a later poll reports it; direct mode retries with capped,
  jittered exponential backoff.
* Drain: RDY 0 everywhere, requeue what the user has not seen, wait for what the user holds
  (up to a deadline, then requeue it), CLS, wait for CLOSE_WAIT, close.
* Pull mode (:mod:`nsq_sansio.consumer.pull`): RDY follows the outstanding fetches;
  connections that delivered recently get them, idle ones keep a probe of 1, a used-up share
  is topped up at once.
* Failure: nsqd refusing IDENTIFY (:class:`~nsq_sansio.errors.IdentifyRejected`, a bad
  configuration) stops the consumer for good: :class:`ConsumerFailed`, state ``FAILED``.

``CloseConnection.final_data`` must be written before the socket is closed (final REQ/FIN/CLS).
A :class:`Deliver` is the handle the user answers with; after its connection is gone, answering
it only produces a :class:`TakenBack` (nsqd requeues such messages itself).

How the package is laid out (each module states its rules at its top). The vocabulary:
``actions`` (what the coordinator tells the transport, :class:`Deliver` included), ``link``
(one connection's bookkeeping), ``fetches`` (pull mode's queue of requests). The policies,
pure: ``rdy`` (even shares, the 25% refresh, ``is_starved``), ``shares`` (who gets RDY),
:mod:`nsq_sansio.backoff`. :class:`ConsumerCoordinator` (``coordinator``) is one façade over
composed parts, each owning its fields and its rules; the list of parts is kept in one place,
:data:`nsq_sansio.consumer.coordinator.PARTS`. The façade keeps the connections and the
per-message paths (messages in, FIN), which read the links' fields directly.
"""

from ..errors import MessageGone
from .actions import (
    Action,
    BackoffChanged,
    CloseConnection,
    CloseHTTPRequest,
    Connect,
    ConnectionUp,
    ConsumerFailed,
    DeadLetter,
    Deliver,
    Disconnected,
    DrainComplete,
    DrainTimedOut,
    FetchEnd,
    FetchResult,
    GiveUp,
    LookupdFailed,
    NodeRefused,
    SendHTTPRequest,
    StartTLS,
    TakenBack,
    TopicNotFound,
)
from .coordinator import ConsumerCoordinator
from .drain import CLOSE_WAIT_GRACE
from .lifecycle import ConsumerState
from .link import RDY_SETTLE_MIN, LinkPhase

__all__ = [
    "CLOSE_WAIT_GRACE",
    "RDY_SETTLE_MIN",
    "Action",
    "BackoffChanged",
    "CloseConnection",
    "CloseHTTPRequest",
    "Connect",
    "ConnectionUp",
    "ConsumerCoordinator",
    "ConsumerFailed",
    "ConsumerState",
    "DeadLetter",
    "Deliver",
    "Disconnected",
    "DrainComplete",
    "DrainTimedOut",
    "FetchEnd",
    "FetchResult",
    "GiveUp",
    "LinkPhase",
    "LookupdFailed",
    "MessageGone",
    "NodeRefused",
    "SendHTTPRequest",
    "StartTLS",
    "TakenBack",
    "TopicNotFound",
]
