"""On every runtime: secrets never show in a repr, a str, a log line, an exception, stats,
events or metrics of a consumer, a producer, an HTTP producer or an admin client.

Planted: the AUTH secret (given as ``auth_secret``, read from an environment variable and
from a file), a wrong secret nsqd refuses (so that refusals are logged and raised), the TLS
key's password and the private CA given inline (``ca_data``). Every client talks to an
embedded nsqd with TLS and AUTH: a consume, a publish, a refused publish, a refused
consumer, an HTTPS publish, an admin call and a metrics scrape; then every text they produced
on the way is searched.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from support.brokers import running_nsqd, unique
from support.runtimes import Runtime
from support.tls import TestCA, make_test_ca

from nsq_sansio.errors import ConfigError
from nsq_sansio.server.options import Authorization, AuthRequest, AuthState
from transports._common import TLSOptions

pytestmark = pytest.mark.anyio

SECRET = "planted-Secret-c41e"
WRONG = "planted-Wrong-0b9d"
KEY_PASSWORD = "planted-KeyPass-77aa"


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return make_test_ca(tmp_path_factory.mktemp("ca"))


def _auth(request: AuthRequest) -> AuthState | None:
    if request.secret == SECRET:
        return AuthState(identity="planted", authorizations=(Authorization(topic=".*"),))
    return AuthState(identity="nobody")


class Texts:
    """Everything the clients showed: reprs, strs, exceptions (with their causes and
    tracebacks), stats, events."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, what: str, *things: Any) -> None:
        for thing in things:
            self.items.append((what, repr(thing)))
            self.items.append((what, str(thing)))
            if isinstance(thing, BaseException):
                self.items.append((what, "".join(traceback.format_exception(thing))))

    def add_client(self, what: str, client: Any, *, stats: bool = True) -> None:
        """The client, its config, its transport options (private, but printable) and,
        for consumers and producers, its stats."""
        self.add(what, client, client.__dict__.get("_options"), client.__dict__.get("_config"))
        for name in ("config", "endpoint"):
            if hasattr(client, name):
                self.add(f"{what}.{name}", getattr(client, name))
        if stats:
            self.add(f"{what}.stats()", client.stats())

    def leaks(self, secrets: list[str]) -> list[tuple[str, str, str]]:
        return [
            (secret, what, text[:300])
            for what, text in self.items
            for secret in secrets
            if secret in text
        ]


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    monkeypatch.setenv("PLANTED_NSQ_SECRET", SECRET)
    yield secret_file


async def call(runtime: Runtime, func: Any, *args: Any) -> Any:
    if runtime.blocking:
        return await anyio.to_thread.run_sync(lambda: func(*args))
    return await func(*args)


async def test_no_secret_in_any_text_a_client_produces(
    runtime: Runtime, test_ca: TestCA, planted: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ca_pem = Path(test_ca.ca_file).read_text()
    ca_mark = ca_pem.splitlines()[1]  # a line of the CA's base64 body
    secrets = [SECRET, WRONG, KEY_PASSWORD, ca_mark]
    tls = TLSOptions(
        ca_data=ca_pem,
        cert_file=test_ca.client_cert_file,
        key_file=test_ca.client_key_file,
        key_password=KEY_PASSWORD,
    )
    texts = Texts()
    texts.add("TLSOptions", tls)
    topic = unique("secret")
    events: list[object] = []
    module = runtime.module
    server_options = {
        "tls_cert": test_ca.cert_file,
        "tls_key": test_ca.key_file,
        "https_address": "127.0.0.1:0",
        "auth_check": _auth,
    }
    with running_nsqd(**server_options) as (server, _):
        async with runtime.producer(
            server.tcp_address, tls=tls, auth_secret=SECRET, auth_requires_tls=True
        ) as producer:
            await producer.publish(topic, b"for the planted identity")
            texts.add_client("producer", producer.client)
        async with runtime.producer(server.tcp_address, tls=tls, auth_secret=WRONG) as refused:
            with pytest.raises(Exception) as caught:
                await refused.publish(topic, b"refused", timeout=10)
            texts.add("refused publish", caught.value)
            texts.add_client("refused producer", refused.client)
        async with runtime.consumer(
            topic,
            "c",
            nsqd=[server.tcp_address],
            tls=tls,
            auth_secret_env="PLANTED_NSQ_SECRET",
            on_event=events.append,
        ) as consumer:
            message = await consumer.get(timeout=10)
            assert message is not None and message.body == b"for the planted identity"
            await consumer.finish(message)
            texts.add("message", message)
            texts.add_client("consumer", consumer.client)
        async with runtime.consumer(
            topic,
            "c",
            nsqd=[server.tcp_address],
            tls=tls,
            auth_secret_file=str(planted),
            auth_requires_tls=True,
        ) as consumer:
            texts.add_client("consumer from a file", consumer.client)
        async with runtime.consumer(
            topic,
            "c",
            nsqd=[server.tcp_address],
            tls=tls,
            auth_secret=WRONG,
            reconnect_delay=0.05,
            max_reconnect_delay=0.1,
            on_event=events.append,
        ) as consumer:
            with anyio.fail_after(10):
                while consumer.stats().connection_errors < 1:
                    await anyio.sleep(0.02)
            texts.add_client("refused consumer", consumer.client)
        https = f"https://{server.https_address}"
        http_producer = module.HTTPProducer([https], tls=tls)
        await call(runtime, http_producer.publish, topic, b"over https")
        texts.add_client("HTTPProducer", http_producer, stats=False)
        await call(runtime, http_producer.close)
        admin = module.NSQDAdmin(https, tls=tls)
        texts.add("nsqd stats", await call(runtime, admin.stats))
        texts.add_client("NSQDAdmin", admin, stats=False)
        await call(runtime, admin.close)
    texts.add("events", *events)
    for record in caplog.records:
        texts.add("log", record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            texts.add("logged exception", record.exc_info[1])
    assert any(what == "log" for what, _ in texts.items)
    assert texts.leaks(secrets) == []
    assert "'***'" in repr(tls)  # the fields are there, hidden


async def test_no_secret_in_the_metrics_of_a_client(
    runtime: Runtime, nsqd: Any, planted: Path
) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from transports import metrics

    registry = CollectorRegistry()
    topic = unique("metrics")
    async with runtime.producer(nsqd.tcp_address, auth_secret=SECRET) as producer:
        metrics.instrument(producer.client, registry=registry)
        await producer.publish(topic, b"x")
        async with runtime.consumer(
            topic, "c", nsqd=[nsqd.tcp_address], auth_secret_file=str(planted)
        ) as consumer:
            metrics.instrument(consumer.client, registry=registry)
            assert await consumer.get(timeout=10) is not None
            scraped = generate_latest(registry).decode()
    assert "nsq_consumer" in scraped and "nsq_producer" in scraped
    assert SECRET not in scraped


async def test_a_password_in_an_address_is_refused_and_not_shown(runtime: Runtime) -> None:
    """nsqd's and nsqlookupd's HTTP APIs have no authentication: a ``user:password@`` in an
    address is a mistake, refused at once, and the error does not repeat the password."""
    module = runtime.module
    url = f"http://admin:{SECRET}@127.0.0.1:4151"
    attempts = [
        lambda: module.HTTPProducer([url]),
        lambda: module.NSQDAdmin(url),
        lambda: module.Consumer("t", "c", lookupd=[url.replace("4151", "4161")]),
    ]
    for attempt in attempts:
        with pytest.raises((ValueError, ConfigError)) as caught:
            attempt()
        assert "user or password" in str(caught.value)
        assert SECRET not in "".join(traceback.format_exception(caught.value))
