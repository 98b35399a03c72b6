"""Helpers for testing code that talks to NSQ, and for this project's own tests.

:mod:`.pytest_plugin` (installed as a ``pytest11`` plugin) gives the ``nsqd``, ``nsqlookupd``
and ``nsq_cluster`` fixtures on the embedded broker; :mod:`.real_nsq` finds and runs the real
NSQ binaries (``RealNSQD``, ``RealLookupd``, ``tool()``) and answers "not found" where there
are none; :mod:`.tls` makes a throwaway self-signed certificate. Nothing is imported here, so
importing one of them does not start pulling in the others.
"""

from __future__ import annotations
