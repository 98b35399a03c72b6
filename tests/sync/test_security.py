"""TLS (private CA, verification on by default, server name) and AUTH, over loopback."""

from __future__ import annotations

from typing import Any

import pytest

from transports.sync import Consumer, NoNSQDAvailable, Producer

from ._helpers import channel_stats, running_nsqd, unique


def test_tls_with_compression_and_client_certificate(test_ca: dict[str, str]) -> None:
    topic = unique()
    with running_nsqd(tls_cert=test_ca["cert"], tls_key=test_ca["key"]) as (server, _):
        tls: dict[str, Any] = {
            "tls_ca_file": test_ca["ca"],
            "tls_cert_file": test_ca["client_cert"],
            "tls_key_file": test_ca["client_key"],
        }
        with Producer(server.tcp_address, snappy=True, **tls) as producer:
            producer.multi_publish(topic, [b"x" * 5000] * 5)
        with Consumer(topic, "c", nsqd=[server.tcp_address], deflate=True, **tls) as c:
            bodies = []
            for _ in range(5):  # max_in_flight=1: one at a time
                m = c.get(timeout=5)
                assert m is not None
                bodies.append(m.body)
                m.finish()
    assert bodies == [b"x" * 5000] * 5


def test_wrong_server_name_is_refused(test_ca: dict[str, str]) -> None:
    with (
        running_nsqd(tls_cert=test_ca["cert"], tls_key=test_ca["key"]) as (server, _),
        Producer(
            server.tcp_address,
            tls_ca_file=test_ca["ca"],
            tls_server_name="not-nsqd.example",
            timeout=1.0,
        ) as producer,
        pytest.raises(NoNSQDAvailable) as refused,
    ):
        producer.publish(unique(), b"x")
    assert type(refused.value) is NoNSQDAvailable
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)  # the name does not match


def test_client_certificate_required_by_nsqd(test_ca: dict[str, str]) -> None:
    """--tls-client-auth-policy=require-verify: the client's certificate is what lets it in."""
    topic = unique()
    server_tls = {
        "tls_cert": test_ca["cert"],
        "tls_key": test_ca["key"],
        "tls_root_ca_file": test_ca["ca"],
        "tls_client_auth_policy": "require-verify",
    }
    with running_nsqd(**server_tls) as (server, runner):
        with_cert: dict[str, Any] = {
            "tls_ca_file": test_ca["ca"],
            "tls_cert_file": test_ca["client_cert"],
            "tls_key_file": test_ca["client_key"],
        }
        with Producer(server.tcp_address, **with_cert) as producer:
            producer.publish(topic, b"for certified eyes")
        with Consumer(topic, "c", nsqd=[server.tcp_address], **with_cert) as c:
            m = c.get(timeout=5)
            assert m is not None and m.body == b"for certified eyes"
            m.finish()
        # The same CA but no client certificate: the handshake is refused, nothing flows.
        with (
            Producer(server.tcp_address, tls_ca_file=test_ca["ca"], timeout=2.0) as p,
            pytest.raises(NoNSQDAvailable) as refused,
        ):
            p.publish(topic, b"should not arrive")
        assert type(refused.value) is NoNSQDAvailable
        assert str(refused.value).startswith(
            f"no nsqd could take the publish: {server.tcp_address}"
        )
        stats = channel_stats(runner, topic, "c")
        assert stats is not None and stats["message_count"] == 1  # only the certified one
