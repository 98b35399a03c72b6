"""TLS (private CA, verification on by default, server name) and AUTH, over loopback."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from nsq_sansio.server.options import Authorization, AuthRequest, AuthState
from transports.sync import Consumer, NoNSQDAvailable, Producer, TLSOptions

from ._helpers import channel_stats, running_nsqd, unique, wait_for


def test_tls_with_a_test_ca(test_ca: dict[str, str]) -> None:
    topic = unique()
    with running_nsqd(tls_cert=test_ca["cert"], tls_key=test_ca["key"]) as (server, runner):
        with Producer(server.tcp_address, tls_ca_file=test_ca["ca"]) as producer:
            producer.multi_publish(topic, [b"secret %d" % i for i in range(10)])
            assert producer.config.tls_v1
        options = TLSOptions(ca_file=test_ca["ca"], server_name="nsqd.test")
        with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=5, tls=options) as c:
            got = []
            for msg in c:
                got.append(msg.body)
                msg.finish()
                if len(got) == 10:
                    break
            stats = channel_stats(runner, topic, "c")
    assert got == [b"secret %d" % i for i in range(10)]
    assert stats is not None and stats["clients"][0]["tls"] is True


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


def test_tls_verification_is_on_by_default(
    test_ca: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Without the private CA the certificate is refused: errors are reported, never raised
    out of the consumer, and no message flows."""
    with running_nsqd(tls_cert=test_ca["cert"], tls_key=test_ca["key"]) as (server, _):
        with (
            Producer(server.tcp_address, tls_v1=True, timeout=1.0) as producer,
            pytest.raises(NoNSQDAvailable) as refused,
        ):
            producer.publish(unique(), b"x")
        assert type(refused.value) is NoNSQDAvailable  # the connection, never the publish
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
        caplog.set_level(logging.WARNING, logger="nsq_sansio")
        with Consumer(
            unique(),
            "c",
            nsqd=[server.tcp_address],
            tls_v1=True,
            reconnect_delay=0.05,
            max_reconnect_delay=0.1,
        ) as consumer:
            wait_for(lambda: consumer.stats().connection_errors >= 2, what="TLS failures")
            assert consumer.get(timeout=0.05) is None
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
    assert server.tcp_address in caplog.text  # log lines carry the connection address


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


def _auth(request: AuthRequest) -> AuthState | None:
    if request.secret == "s3cret":
        return AuthState(
            identity="alice",
            authorizations=(Authorization(topic=".*", channels=(".*",)),),
        )
    return AuthState(identity="nobody")


def test_auth() -> None:
    topic = unique()
    with running_nsqd(auth_check=_auth) as (server, _):
        with Producer(server.tcp_address, auth_secret="s3cret") as producer:
            producer.publish(topic, b"authorised")
        with Consumer(topic, "c", nsqd=[server.tcp_address], auth_secret=b"s3cret") as c:
            msg = c.get(timeout=5)
            assert msg is not None and msg.body == b"authorised"
            msg.finish()
        # a secret with no grant: nsqd closes the connection; the consumer only reports it
        with Consumer(
            topic,
            "c",
            nsqd=[server.tcp_address],
            auth_secret="wrong",
            reconnect_delay=0.05,
            max_reconnect_delay=0.1,
        ) as c:
            wait_for(lambda: c.stats().reconnects >= 1, what="reconnect attempts")
            assert c.get(timeout=0.05) is None


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
