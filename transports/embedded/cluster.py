"""An nsqlookupd plus N nsqds registered with it, started and stopped together."""

from __future__ import annotations

import http.client
import json
import time
from types import TracebackType
from typing import Any
from urllib.parse import quote

import anyio
import anyio.abc

from nsq_sansio.server.lookupd import LookupdAPIError

from ._net import abandon_task_group
from .lookupd import EmbeddedLookupd
from .nsqd import EmbeddedNSQD

__all__ = ["Cluster"]


class Cluster:
    """A small NSQ cluster for tests: ``async with Cluster(nsqd_count=2) as c: ...``."""

    def __init__(
        self,
        *,
        nsqd_count: int = 1,
        with_lookupd: bool = True,
        nsqd_options: dict[str, Any] | None = None,
        lookupd_options: dict[str, Any] | None = None,
    ) -> None:
        if nsqd_count < 0:
            raise ValueError(f"nsqd_count must be >= 0, got {nsqd_count}")
        self._nsqd_count = nsqd_count
        self._nsqd_options = dict(nsqd_options or {})
        self.lookupd: EmbeddedLookupd | None = (
            EmbeddedLookupd(**(lookupd_options or {})) if with_lookupd else None
        )
        self.nsqds: list[EmbeddedNSQD] = []
        self._task_group: anyio.abc.TaskGroup | None = None

    @property
    def nsqd(self) -> EmbeddedNSQD:
        """The first nsqd."""
        if not self.nsqds:
            raise RuntimeError("the cluster has no running nsqd")
        return self.nsqds[0]

    @property
    def lookupd_http_urls(self) -> list[str]:
        """``http://host:port`` of the nsqlookupd HTTP API (empty without a lookupd)."""
        return [self.lookupd.http_url] if self.lookupd is not None else []

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        """``host:port`` of every nsqd's TCP listener, in start order."""
        return [n.tcp_address for n in self.nsqds]

    async def wait_registered(self, topic: str, timeout: float = 5.0) -> None:
        """Wait until every nsqd that has ``topic`` is listed by the lookupd's ``/lookup``.

        Awaitable from the cluster's own loop or from any other (a trio test with the
        cluster on a :class:`ServerThread`): the registry is read with the lookupd's clock,
        :meth:`EmbeddedLookupd.now`, never the caller's ``anyio.current_time()``.
        """
        if self.lookupd is None:
            return
        lookupd = self.lookupd
        with anyio.fail_after(timeout):
            while True:
                try:
                    expected = sum(1 for n in self.nsqds if n.core_has_topic(topic))
                    try:
                        found = len(lookupd.core.lookup(topic, lookupd.now())["producers"])
                    except LookupdAPIError:  # TOPIC_NOT_FOUND: nobody registered it yet
                        found = 0
                    if found >= expected:
                        return
                except RuntimeError:  # read from another thread while the loop changed it
                    pass
                await anyio.sleep(0.01)

    def wait_registered_blocking(
        self, topic: str, producers: int | None = None, timeout: float = 5.0
    ) -> None:
        """From blocking code (e.g. with the ``nsq_cluster`` fixture): poll the lookupd's
        ``/lookup`` over HTTP until ``producers`` nsqds (default: all) list ``topic``."""
        if self.lookupd is None:
            return
        want = len(self.nsqds) if producers is None else producers
        host, port = self.lookupd.http_address.rsplit(":", 1)
        deadline = time.monotonic() + timeout
        while True:
            found = 0
            conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
            try:
                conn.request("GET", f"/lookup?topic={quote(topic)}")
                resp = conn.getresponse()
                body = resp.read()
                if resp.status == 200:
                    found = len(json.loads(body).get("producers") or [])
            except (OSError, ValueError):
                pass
            finally:
                conn.close()
            if found >= want:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{want} producer(s) of {topic!r} not registered in {timeout}s")
            time.sleep(0.01)

    async def __aenter__(self) -> Cluster:
        """Start the lookupd and the nsqds; if one cannot start, what it raised is raised
        alone (a :class:`~transports.embedded.errors.ListenError` for a port in use) and
        those already started are stopped."""
        self._task_group = tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            lookupd_tcp: list[str] = []
            if self.lookupd is not None:
                await self.lookupd.start(tg)
                lookupd_tcp.append(self.lookupd.tcp_address)
            for _ in range(self._nsqd_count):
                options = dict(self._nsqd_options)
                options.setdefault("lookupd_tcp_addresses", lookupd_tcp)
                nsqd = EmbeddedNSQD(**options)
                await nsqd.start(tg)
                self.nsqds.append(nsqd)
        except BaseException:
            self._task_group = None
            await abandon_task_group(tg, self._shutdown)
            raise
        return self

    async def _shutdown(self) -> None:
        for nsqd in self.nsqds:
            await nsqd.aclose()
        if self.lookupd is not None:
            await self.lookupd.aclose()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg, self._task_group = self._task_group, None
        if tg is None:
            raise RuntimeError("Cluster.__aexit__ without __aenter__")
        tg.cancel_scope.cancel()
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        finally:
            await self._shutdown()
