"""The admin client over HTTPS, on every runtime, against the embedded nsqd's and the real
nsqd's HTTPS port: a private CA given as TLSOptions or an SSLContext works (and keeps its
connection alive); a certificate that does not verify, or a wrong server name, is refused."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.tls import TestCA, make_test_ca

from nsq_sansio.errors import ConnectionLost
from transports._common.tls import TLSOptions
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries

from .conftest import AdminRuntime

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    pytest.importorskip("cryptography")
    return make_test_ca(Path(tmp_path_factory.mktemp("admin-ca")))


@pytest.fixture(params=["embedded", "real"])
def https_url(request: pytest.FixtureRequest, ca: TestCA) -> Iterator[str]:
    if request.param == "embedded":
        server = EmbeddedNSQD(
            tls_cert=ca.cert_file, tls_key=ca.key_file, https_address="127.0.0.1:0"
        )
        with ServerThread(server):
            yield f"https://{server.https_address}"
        return
    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)
    # RealNSQD gives nsqd's HTTPS listener a port of its own (picked again, with the others,
    # if another process takes one before nsqd binds it)
    with RealNSQD([f"--tls-cert={ca.cert_file}", f"--tls-key={ca.key_file}"]) as real:
        yield f"https://{real.https_address}"


async def test_https_with_a_private_ca(runtime: AdminRuntime, https_url: str, ca: TestCA) -> None:
    async with runtime.nsqd(https_url, tls=TLSOptions(ca_file=ca.ca_file)) as nsqd:
        await nsqd.ping()
        assert (await nsqd.info()).version == "1.3.0"
        await nsqd.create_topic("adm_tls")
        assert [t.name for t in (await nsqd.stats()).topics] == ["adm_tls"]
    context = ssl.create_default_context(cafile=ca.ca_file)
    nsqd = runtime.make("NSQDAdmin", https_url, tls=context)
    await nsqd.delete_topic("adm_tls")
    await nsqd.close()


@pytest.mark.parametrize(
    "tls",
    [None, "wrong-name"],
    ids=["untrusted", "wrong-server-name"],
)
async def test_https_refused_when_the_certificate_does_not_verify(
    runtime: AdminRuntime, https_url: str, ca: TestCA, tls: str | None
) -> None:
    options = None if tls is None else TLSOptions(ca_file=ca.ca_file, server_name="x.example")
    async with runtime.nsqd(https_url, tls=options) as nsqd:
        with pytest.raises(ConnectionLost, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
            await nsqd.ping()
