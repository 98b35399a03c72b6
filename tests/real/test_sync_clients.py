"""The blocking clients (``transports.sync``) against a real nsqd v1.3.0.

What only the blocking runtime has, against a real nsqd (the scenarios every runtime shares
run against it in test_clients_real.py): pipelined publishes on one connection, with the test
body of ``tests/sync`` unchanged (``nsqd`` is ``(server, runner)``); then TLS with compression
and a client certificate.
"""

from __future__ import annotations

from typing import Any

import pytest
from sync.conftest import no_thread_left_behind, test_ca  # noqa: F401 (fixtures, as in tests/sync)
from sync.test_roundtrip import (  # noqa: F401 (collected here against the real nsqd)
    test_publish_async_pipelines_many_on_one_connection,
)

from transports.sync import Consumer, Producer

from .conftest import RealBroker, RealRunner, start_real_nsqd


@pytest.fixture
def nsqd(real_nsqd: RealBroker) -> tuple[RealBroker, RealRunner]:
    return real_nsqd, RealRunner(real_nsqd)


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_tls_with_compression_and_a_client_certificate(
    test_ca: dict[str, str],  # noqa: F811
    compression: str,
) -> None:
    # nsqd requires TLS on TCP (HTTP stays plain: "tcp-https") and a client certificate its
    # CA signed; both sides compress inside TLS
    real = start_real_nsqd(
        tls_cert=test_ca["cert"],
        tls_key=test_ca["key"],
        tls_root_ca_file=test_ca["ca"],
        tls_client_auth_policy="require-verify",
        tls_required="tcp-https",
    )
    try:
        topic = f"tls-{compression}"
        tls: dict[str, Any] = {
            "tls_ca_file": test_ca["ca"],
            "tls_cert_file": test_ca["client_cert"],
            "tls_key_file": test_ca["client_key"],
            compression: True,
        }
        bodies = [b"secret %d " % i * 300 for i in range(20)]
        with Producer(real.tcp_address, **tls) as producer:
            producer.multi_publish(topic, bodies[:10])
            for body in bodies[10:]:
                producer.publish(topic, body)
        with Consumer(topic, "c", nsqd=[real.tcp_address], max_in_flight=5, **tls) as consumer:
            got = []
            while len(got) < len(bodies):
                msg = consumer.get(timeout=10)
                assert msg is not None
                got.append(msg.body)
                msg.finish()
            channel = real.channel_stats(topic, "c")
        assert got == bodies
        assert channel is not None
        (client,) = channel["clients"]
        assert client["tls"] is True and client[compression] is True
        assert client["tls_version"].startswith("TLS")
    finally:
        real.close()
