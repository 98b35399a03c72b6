"""Blocking transport: NSQ consumer and producer for ordinary threaded Python code.

Consume (push mode)::

    from transports.sync import Consumer, Producer, drain_on_signals

    with Consumer("events", "archive", lookupd=["http://127.0.0.1:4161"],
                  max_in_flight=200) as c, drain_on_signals(c):
        for msg in c:                       # ends when a drain starts or the consumer closes
            handle(msg.body)
            msg.finish()                    # msg.requeue(delay=..., backoff=...), msg.touch()

    c.run(handler, concurrency=8)           # None/True -> FIN; False, raises -> REQ (+ backoff)
    c.drain(timeout=30)                     # graceful stop, see below

Consume (pull mode, JetStream-style; what the Spark source builds on)::

    with Consumer("events", "spark", nsqd=["127.0.0.1:4150"], pull=True,
                  max_in_flight=1000, msg_timeout=120) as c:
        batch = c.fetch(500, timeout=5.0)   # up to 500, whatever arrived after 5 s
        more = c.fetch(500, no_wait=True)   # only what is already buffered, maybe []
        with contextlib.ExitStack() as stack:
            for m in batch:                 # hold them while the batch is committed...
                stack.enter_context(m.keepalive())
            commit(batch)
        for m in batch:
            m.finish()                      # ...and FIN only after the commit

RDY follows the outstanding fetches, so nsqd never pushes more than was asked. Messages not
answered when the consumer closes are requeued by nsqd: delivery is at-least-once, so a
commit must be idempotent (or keyed by ``msg.id``).

Publish::

    with Producer(["127.0.0.1:4150", "127.0.0.1:4250"]) as p:     # a pool, with failover
        p.publish("events", b"hello")
        p.multi_publish("events", [b"a", b"b"])
        p.deferred_publish("events", b"later", delay=5.0)
        futures = [p.multi_publish_async("events", chunk) for chunk in chunks]  # pipelined
        for f in futures:
            f.result()

    with HTTPProducer("http://127.0.0.1:4151") as p:              # /pub and /mpub over h11
        p.publish("events", b"hello")

Options: every keyword that names a :class:`nsq_sansio.config.Config` field goes to the config
(``max_in_flight``, ``max_attempts``, ``msg_timeout``, ``heartbeat_interval``, ``snappy``,
``deflate``, ``auth_secret``, ``connect_timeout``, ``lookupd_poll_interval``...; or pass
``config=Config(...)``). TLS: ``tls_v1=True`` (verification on, system CAs), or
``tls=TLSOptions(ca_file=..., cert_file=..., key_file=..., server_name=...)``, or the flat
``tls_ca_file=``, ``tls_cert_file=``, ``tls_key_file=``, ``tls_server_name=``,
``tls_verify=`` (any of them turns TLS on).

Threads and guarantees:

* One IO thread per Consumer / Producer owns every socket (a ``selectors`` loop with a wake-up
  socketpair). It answers heartbeats whatever user code does, and sleeps until the core's next
  deadline. User code runs in the caller's thread (``for msg in c``, ``fetch``) or in
  ``run()``'s worker threads; ``Message`` methods are thread-safe and never block.
* At most ``max_in_flight`` messages are held by user code (the broker cannot send more).
* Connection errors never end a consumer: they are logged (``logging``, logger
  ``nsq_sansio.sync.*``, each line prefixed with the ``[host:port]`` of the connection),
  counted in :meth:`Consumer.stats` and reported to ``on_event``. Reconnection and lookupd
  polling are decided by the core's coordinator.
* Nothing is TOUCHed unless asked: ``msg.touch()``, or ``with msg.keepalive():`` which touches
  half-way to each deadline (the core's ``next_touch``); once TOUCH cannot extend the message
  past nsqd's ``max_msg_timeout`` it says so with a warning and a :class:`KeepaliveExpired`
  event (``msg.keepalive_expiring`` turns True).
* Answers never raise: ``finish()``/``requeue()`` return True when this call answered the
  message; one that came too late sets ``msg.taken_back``. A misuse raises the same exception
  as on the async runtime (``LocalProtocolError``...), see ``docs/transports.md``.
* ``drain()`` / ``start_drain()`` / :func:`drain_on_signals`: RDY 0 everywhere, messages not yet
  handed to user code are requeued at once, messages in user code get ``timeout`` seconds to be
  answered, then they are requeued (a ``run()`` handler still running is left to its thread,
  which cannot be cancelled: reported in the log and in the ``DrainResult`` ``drain()``
  returns), CLS and close. A second signal during the drain stops at once. Leaving the
  ``with`` block does the same with no grace: every unanswered message is requeued, and every
  thread of ours is joined (but a handler's still running).
* Producer: many publishes in flight per connection, answers matched in order; ``max_pending``
  bounds unanswered publishes (a call beyond it blocks, then raises ``TimeoutError``); a
  publish whose connection died is sent again (another nsqd first), until its ``timeout``;
  when no nsqd can be connected it raises ``NoNSQDAvailable`` within ``connect_timeout``
  (``p.connect()`` checks that at start-up).
"""

from __future__ import annotations

from nsq_sansio.discovery import allow_nsqd
from nsq_sansio.errors import HTTPPublishError, NoNSQDAvailable
from transports._common import (
    ConnectionStats,
    ConsumerStats,
    DrainResult,
    ProducerStats,
    TLSOptions,
)

from .admin import LookupdAdmin, NSQDAdmin
from .consumer import Consumer, EventCallback, KeepaliveExpired, Message
from .http import HTTPProducer
from .producer import Producer, PublishFuture
from .publish_future import PublishObserver
from .signals import drain_on_signals

__all__ = [
    "ConnectionStats",
    "Consumer",
    "ConsumerStats",
    "DrainResult",
    "EventCallback",
    "HTTPProducer",
    "HTTPPublishError",
    "KeepaliveExpired",
    "LookupdAdmin",
    "Message",
    "NSQDAdmin",
    "NoNSQDAvailable",
    "Producer",
    "ProducerStats",
    "PublishFuture",
    "PublishObserver",
    "TLSOptions",
    "allow_nsqd",
    "drain_on_signals",
]
