"""``nsq-sansio``: the command line (the ``cli`` extra installs it).

::

    nsq-sansio demo       the main job: embedded lookupd + 2 nsqd, push and pull channels,
                          retries, give-ups, a table; exit 0 only if every message is accounted
    nsq-sansio tail       print a topic's messages (nsq_tail)
    nsq-sansio pub        publish lines of stdin or a file (to_nsq), MPUB batches, rate limit
    nsq-sansio stat       live table of topic/channel depth, in-flight and rates (nsq_stat)
    nsq-sansio to-file    archive a channel to rolling files, FIN after fsync (nsq_to_file)
    nsq-sansio nsqd       run an embedded nsqd (nsqd's flags)
    nsq-sansio lookupd    run an embedded nsqlookupd (nsqlookupd's flags)

They work against any nsqd / nsqlookupd, embedded or real. Flag names follow NSQ's own tools
(``--nsqd-tcp-address``, ``--lookupd-http-address``, ``--topic``, ``--channel``,
``--max-in-flight``); Go's single-dash spelling (``-topic``) is accepted too. Errors print one
line (``nsq-sansio tail: ...``): exit code 2 for a wrong command line, 1 when the command
cannot start or go on.

One module per command (``tail``, ``pub``, ``stat``, ``to_file`` with ``archive``, ``servers``
for ``nsqd``/``lookupd``, the ``demo`` package), ``common`` for what they share, ``main`` for
the dispatch, ``progress`` for the progress display the demo and ``to-file`` draw.
"""

from __future__ import annotations

from .common import CLIError
from .main import main

__all__ = ["CLIError", "main"]
