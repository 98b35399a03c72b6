"""On every runtime: ``auth_requires_tls=True`` never sends the AUTH secret in clear.

The embedded nsqd requires AUTH and offers TLS. Without TLS the consumer fails with
:class:`~nsq_sansio.errors.InsecureAuthRefused` and the producer's publish raises it, and the
auth server is never asked (the secret never left); with TLS both work and the auth server
sees the secret.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.brokers import running_nsqd, unique
from support.runtimes import Runtime
from support.tls import TestCA, make_test_ca

from nsq_sansio.errors import InsecureAuthRefused
from nsq_sansio.server.options import Authorization, AuthRequest, AuthState

pytestmark = pytest.mark.anyio

SECRET = "auth-over-tls-only"


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return make_test_ca(tmp_path_factory.mktemp("ca"))


class AuthServer:
    """The auth check, remembering the secrets it was asked about."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, request: AuthRequest) -> AuthState | None:
        self.asked.append(request.secret)
        return AuthState(identity="tls-only", authorizations=(Authorization(topic=".*"),))


@pytest.fixture
def broker(test_ca: TestCA) -> Iterator[tuple[str, AuthServer]]:
    auth = AuthServer()
    with running_nsqd(tls_cert=test_ca.cert_file, tls_key=test_ca.key_file, auth_check=auth) as (
        server,
        _,
    ):
        yield server.tcp_address, auth


async def test_no_auth_over_plaintext(runtime: Runtime, broker: tuple[str, AuthServer]) -> None:
    address, auth = broker
    topic = unique("insecure")
    async with runtime.producer(
        address, auth_secret=SECRET, auth_requires_tls=True, timeout=5
    ) as producer:
        with pytest.raises(InsecureAuthRefused, match="auth_requires_tls"):
            await producer.publish(topic, b"never sent")
    async with runtime.consumer(
        topic, "c", nsqd=[address], auth_secret=SECRET, auth_requires_tls=True
    ) as consumer:
        with pytest.raises(InsecureAuthRefused, match="auth_requires_tls"):
            await consumer.get(timeout=10)
    assert auth.asked == []  # the secret never reached nsqd


async def test_auth_over_tls(
    runtime: Runtime, broker: tuple[str, AuthServer], test_ca: TestCA
) -> None:
    address, auth = broker
    topic = unique("secure")
    options = {"auth_secret": SECRET, "auth_requires_tls": True, "tls_ca_file": test_ca.ca_file}
    async with runtime.producer(address, **options) as producer:
        await producer.publish(topic, b"over TLS")
    async with runtime.consumer(topic, "c", nsqd=[address], **options) as consumer:
        message = await consumer.get(timeout=10)
        assert message is not None and message.body == b"over TLS"
        await consumer.finish(message)
    assert auth.asked and set(auth.asked) == {SECRET}
