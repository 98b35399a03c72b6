"""Make the plugin's fixtures available even when nsq-sansio is not installed (entry point)."""

from transports.testing.pytest_plugin import nsq_cluster, nsqd, nsqlookupd

__all__ = ["nsq_cluster", "nsqd", "nsqlookupd"]
