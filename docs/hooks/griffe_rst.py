"""A griffe extension for the API reference: this project's docstrings use reStructuredText's
inline roles (``:class:`~nsq_sansio.config.Config```) and literal blocks (``Example::``), while
mkdocstrings renders docstrings as Markdown. Roles become code spans (``~`` keeps the last
name only, as Sphinx does) and ``::`` ends a sentence with ``:`` before its indented block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|exc|data|obj|const):`([^`]+)`")


def _role(match: re.Match[str]) -> str:
    text = match.group(1).strip()
    if "<" in text and text.endswith(">"):  # :class:`title <target>`
        return f"`{text.split('<', 1)[0].strip()}`"
    if text.startswith("~"):
        text = text[1:].rsplit(".", 1)[-1]
    return f"`{text.lstrip('.')}`"


def markdown_of(docstring: str) -> str:
    """The docstring with its reStructuredText inline markup turned into Markdown."""
    text = _ROLE.sub(_role, docstring)
    lines = text.split("\n")
    out: list[str] = []
    for index, line in enumerate(lines):
        if line.rstrip().endswith("::"):
            stripped = line.rstrip()[:-2].rstrip()
            if stripped:
                out.append(stripped + ":")
            following = lines[index + 1] if index + 1 < len(lines) else ""
            if following.strip():
                out.append("")
            continue
        out.append(line)
    return "\n".join(out)


class RestructuredTextRoles(griffe.Extension):
    """Rewrites every docstring griffe loads (see the module docstring)."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
