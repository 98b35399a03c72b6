"""``transports.trio``: the same API, inside plain ``trio.run`` / trio nurseries."""

from __future__ import annotations

import uuid

import anyio
import pytest
import trio

from nsq_sansio.errors import LocalProtocolError
from transports import trio as nsq_trio
from transports.embedded import EmbeddedNSQD


def test_round_trip_under_trio_run(nsqd: EmbeddedNSQD) -> None:
    topic = f"t{uuid.uuid4().hex[:12]}"

    async def main() -> list[bytes]:
        got: list[bytes] = []
        async with nsq_trio.Producer(nsqd.tcp_address) as p:
            await p.multi_publish(topic, [b"a", b"b"])
        async with (
            nsq_trio.Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=2) as c,
            trio.open_nursery() as nursery,
        ):

            async def handler(msg: nsq_trio.Message) -> None:
                got.append(msg.body)
                if len(got) == 2:
                    nursery.start_soon(c.drain)

            with trio.fail_after(10):
                await c.run(handler)
        return got

    assert sorted(trio.run(main)) == [b"a", b"b"]


def test_refuses_asyncio(nsqd: EmbeddedNSQD) -> None:
    async def main() -> None:
        async with nsq_trio.Producer(nsqd.tcp_address):
            pass

    with pytest.raises(LocalProtocolError, match="trio"):
        anyio.run(main, backend="asyncio")


@pytest.mark.parametrize("admin", ["NSQDAdmin", "LookupdAdmin"])
def test_admin_refuses_asyncio_and_works_under_trio(nsqd: EmbeddedNSQD, admin: str) -> None:
    cls = getattr(nsq_trio, admin)

    async def ping() -> None:
        await cls(f"http://{nsqd.http_address}").ping()

    with pytest.raises(LocalProtocolError, match=f"transports.trio.{admin}"):
        anyio.run(ping, backend="asyncio")
    if admin == "NSQDAdmin":  # an nsqd answers /ping; a lookupd address is not at hand here
        trio.run(ping)
