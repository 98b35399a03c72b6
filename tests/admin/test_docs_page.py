"""docs/admin.md runs: its Python blocks, in order and in one namespace (each uses what the
ones before it defined), against the embedded broker its first block starts."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "admin.md"


@pytest.mark.timeout(60)
def test_every_block_of_the_admin_page_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= 10
    namespace: dict[str, Any] = {"__name__": "admin_page"}
    out = io.StringIO()
    try:
        for number, block in enumerate(blocks, 1):
            code = compile(block, f"{PAGE.name} block {number}", "exec")
            with contextlib.redirect_stdout(out):
                exec(code, namespace)
    finally:
        servers = namespace.get("servers")
        if servers is not None:
            servers.stop()
    printed = out.getvalue()
    # the first channel of a topic gets what the topic held: 10 published before it, 5 after
    assert "billing is 15 messages behind on 1 nsqd" in printed
    assert "404 CHANNEL_NOT_FOUND" in printed and "404 NOT_FOUND" in printed
