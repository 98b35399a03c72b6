"""Every public name of the documented modules has a docstring: the API reference is generated
from them, so a missing one is a hole in the reference and fails the docs build.

"Public" is what a module exports (its ``__all__``) and, for an exported class, its methods and
properties whose names do not start with ``_``. A method that overrides a documented one of a
base class inherits that docstring (the reference shows it). The check reads the source with
griffe, as mkdocstrings does, so it sees exactly what the reference pages render.

    python docs/hooks/api_check.py          # list what is missing, exit 1 if anything is
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[2]

#: The modules the API reference documents (docs/reference/*.md render these).
DOCUMENTED_MODULES: tuple[str, ...] = (
    "nsq_sansio",
    "nsq_sansio.connection",
    "nsq_sansio.events",
    "nsq_sansio.errors",
    "nsq_sansio.config",
    "nsq_sansio.consumer",
    "nsq_sansio.backoff",
    "nsq_sansio.consumer.rdy",
    "nsq_sansio.discovery",
    "nsq_sansio.frames",
    "nsq_sansio.compression",
    "nsq_sansio.names",
    "nsq_sansio.server",
    "nsq_sansio.testing",
    "nsq_sansio.testing.strategies",
    "nsq_sansio.testing.scenarios",
    "transports.anyio",
    "transports.trio",
    "transports.sync",
    "transports.embedded",
    "transports.spark",
    "transports.metrics",
    "transports.otel",
    "transports.otel.envelope",
    "transports.cli",
    "transports.testing.pytest_plugin",
    "transports.testing.real_nsq",
    "transports.testing.tls",
    "nsq_sansio.server.lookupd",
)

#: Base classes from other libraries whose methods this project overrides with their documented
#: meaning (Spark's data source interface, prometheus-client's collectors).
DOCUMENTED_UPSTREAM = ("pyspark.", "prometheus_client.")

# Public names allowed without a docstring: none. An entry is for a name a branch is rewriting
# while it is merged; one that has a docstring (or no longer exists) fails tests/docs, so the
# list cannot go stale.
ALLOWED_MISSING: frozenset[str] = frozenset()


def _docstring(obj: griffe.Object) -> str:
    return obj.docstring.value.strip() if obj.docstring is not None else ""


def _target(obj: griffe.Object | griffe.Alias) -> griffe.Object | None:
    if not obj.is_alias:
        return obj  # type: ignore[return-value]
    try:
        return obj.final_target  # type: ignore[union-attr,return-value]
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _documented_in_base(cls: griffe.Class, name: str) -> bool:
    """Whether a base class (ours, resolved, or an upstream interface) documents ``name``."""
    for base in cls.bases:
        path = getattr(base, "canonical_path", str(base))
        if path.startswith(DOCUMENTED_UPSTREAM):
            return True
    for base in cls.resolved_bases:
        member = base.members.get(name)
        if member is not None:
            target = _target(member)
            if target is not None and _docstring(target):
                return True
        if _documented_in_base(base, name):
            return True
    return False


def _needs_docstring(obj: griffe.Object) -> bool:
    if obj.is_module or obj.is_class or obj.is_function:
        return True
    return obj.is_attribute and "property" in obj.labels


def _walk(obj: griffe.Object, owner: griffe.Class | None, seen: set[str], out: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if (
        _needs_docstring(obj)
        and not _docstring(obj)
        and (owner is None or not _documented_in_base(owner, obj.name))
    ):
        out.add(obj.path)
    if obj.is_class:
        for name, member in obj.members.items():
            if name.startswith("_"):
                continue
            target = _target(member)
            if target is not None and not target.is_alias:
                _walk(target, obj, seen, out)  # type: ignore[arg-type]


def _load(search_paths: Sequence[Path], modules: Iterable[str]) -> dict[str, griffe.Module]:
    loader = griffe.GriffeLoader(search_paths=[str(p) for p in search_paths])
    tops: dict[str, griffe.Module] = {}
    for module in modules:
        top = module.split(".", 1)[0]
        if top not in tops:
            tops[top] = loader.load(top)  # type: ignore[assignment]
    loader.resolve_aliases(implicit=False, external=None)
    return tops


def missing_docstrings(
    search_paths: Sequence[Path] = (ROOT,), modules: Sequence[str] = DOCUMENTED_MODULES
) -> list[str]:
    """Paths (where each is defined) of the public names without a docstring, sorted."""
    tops = _load(search_paths, modules)
    out: set[str] = set()
    seen: set[str] = set()
    for module_path in modules:
        top, _, rest = module_path.partition(".")
        module: griffe.Object = tops[top]
        for part in rest.split(".") if rest else ():
            module = module.members[part]  # type: ignore[assignment]
        if not _docstring(module):
            out.add(module.path)
        exports = module.exports if module.is_module else None  # type: ignore[union-attr]
        names = (
            [str(name) if isinstance(name, str) else name.name for name in exports]
            if exports is not None
            else [name for name in module.members if not name.startswith("_")]
        )
        for name in names:
            member = module.members.get(name)
            if member is None:
                out.add(f"{module.path}.{name} (in __all__, not defined)")
                continue
            target = _target(member)
            if target is None or target.is_alias:
                continue  # re-exported from another library
            if target.path.split(".", 1)[0] not in tops:
                continue  # re-exported from another library
            _walk(target, None, seen, out)  # type: ignore[arg-type]
    return sorted(out)


def problems(search_paths: Sequence[Path] = (ROOT,)) -> list[str]:
    """What fails the build: public names without a docstring (and not allowed yet)."""
    missing = missing_docstrings(search_paths)
    return [f"missing docstring: {path}" for path in missing if path not in ALLOWED_MISSING]


def stale_allowances(search_paths: Sequence[Path] = (ROOT,)) -> list[str]:
    """Entries of ALLOWED_MISSING that have a docstring now or no longer exist: to remove
    (tests/docs checks it; the build itself does not fail on them)."""
    return sorted(ALLOWED_MISSING - set(missing_docstrings(search_paths)))


if __name__ == "__main__":
    found = problems() + [f"stale ALLOWED_MISSING entry: {path}" for path in stale_allowances()]
    print("\n".join(found) or "every public name has a docstring")
    sys.exit(1 if found else 0)
