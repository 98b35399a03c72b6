from transports.testing.pytest_plugin import nsq_cluster, nsqd, nsqlookupd  # noqa: F401
