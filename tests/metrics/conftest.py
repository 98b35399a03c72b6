from transports.pytest_plugin import nsq_cluster, nsqd, nsqlookupd  # noqa: F401
