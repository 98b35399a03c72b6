"""Old home of :mod:`transports.testing.pytest_plugin`, kept only for installs whose ``pytest11``
entry point still names ``transports.pytest_plugin`` (an editable install made before the move
keeps its old entry-point metadata until it is re-installed). Remove once they are gone."""

from __future__ import annotations

from transports.testing.pytest_plugin import nsq_cluster, nsqd, nsqlookupd

__all__ = ["nsq_cluster", "nsqd", "nsqlookupd"]
