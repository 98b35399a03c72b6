"""One shape on every runtime: the async and blocking admin clients have the same public
names, parameters and return types, and every call is one of the core's requests (the
runtimes add no call of their own)."""

from __future__ import annotations

import inspect

import pytest

from nsq_sansio import admin as core
from transports.anyio import admin as async_admin
from transports.sync import admin as sync_admin

LIFECYCLE = {"close"}


def public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


@pytest.mark.parametrize(
    ("name", "api"), [("NSQDAdmin", core.NSQDAPI), ("LookupdAdmin", core.LookupdAPI)]
)
def test_async_and_blocking_twins(name: str, api: type) -> None:
    async_methods = public(getattr(async_admin, name))
    sync_methods = public(getattr(sync_admin, name))
    assert async_methods == sync_methods
    assert inspect.signature(getattr(async_admin, name)) == inspect.signature(
        getattr(sync_admin, name)
    )
    for method in async_methods:
        assert inspect.iscoroutinefunction(getattr(getattr(async_admin, name), method)), method
        assert not inspect.iscoroutinefunction(getattr(getattr(sync_admin, name), method))
        assert getattr(getattr(sync_admin, name), method).__doc__, method
    calls = set(async_methods) - LIFECYCLE
    assert calls == set(public(api)), "each call is one of the core's requests"
    for call in calls:
        runtime = list(async_methods[call].parameters.values())[1:]  # without self
        assert runtime == list(inspect.signature(getattr(api, call)).parameters.values()), call


def test_context_managers() -> None:
    for cls in (async_admin.NSQDAdmin, async_admin.LookupdAdmin):
        assert hasattr(cls, "__aenter__") and hasattr(cls, "__aexit__")
    for cls in (sync_admin.NSQDAdmin, sync_admin.LookupdAdmin):
        assert hasattr(cls, "__enter__") and hasattr(cls, "__exit__")
