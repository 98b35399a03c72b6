"""Exception groups, taken apart: what the anyio clients raise instead of a group.

A task group wraps what its tasks raise in an exception group. The clients never let the
user's exception reach one, and their own tasks never raise; where a group can still come
out (a handler of ``run()`` raising ``KeyboardInterrupt``...), :func:`sole_error` finds the
one exception it stands for, so that one is raised, as itself. No ``except*``: Python 3.10
imports this module.
"""

from __future__ import annotations

import sys

import anyio

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup
else:  # pragma: no cover - anyio depends on the backport there
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found]

__all__ = ["sole_error"]


def sole_error(raised: BaseException) -> BaseException | None:
    """The one exception ``raised`` stands for: itself when it is not a group; else the only
    exception in it (nested groups flattened) that is not a cancellation, when there is
    exactly one (the cancellations beside it come from the same failure, or are delivered
    again by their scope at the next checkpoint); else None (several errors: keep the group)."""
    if not isinstance(raised, BaseExceptionGroup):
        return raised
    cancelled = anyio.get_cancelled_exc_class()
    found: BaseException | None = None
    stack: list[BaseException] = list(raised.exceptions)
    while stack:
        error = stack.pop()
        if isinstance(error, BaseExceptionGroup):
            stack.extend(error.exceptions)
        elif not isinstance(error, cancelled):
            if found is not None:
                return None
            found = error
    return found
