"""Helpers shared by the test directories (imported as ``support``: pytest puts ``tests/`` on
``sys.path``, as for ``conformance.wire``).

* :mod:`.brokers`: fresh names, polling, embedded brokers on threads, nsqd's ``/stats``, the
  real binaries (skip markers, SIGSTOP, per-topic counts);
* :mod:`.tls`: a throwaway CA with a server and a client certificate;
* :mod:`.runtimes`: one adapter per client runtime (asyncio, trio, blocking), so a scenario
  written once runs on each of them.
"""
