"""The mkdocs hook of this project's documentation (``hooks:`` in mkdocs.yml).

* Before the build: every public name of the documented modules must have a docstring
  (``api_check.py``); a missing one fails the build, naming it.
* Each page: ``<!-- generated: NAME -->`` lines become the tables ``generated.py`` builds from
  the code (the command line's flags, the Spark data source's options).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for path in (str(ROOT), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

import api_check  # noqa: E402
import generated  # noqa: E402


def on_config(config: Any, **kwargs: Any) -> Any:
    """Fail the build on a public name without a docstring."""
    found = api_check.problems((ROOT,))
    if found:
        raise PluginError(
            "the API reference has holes (docs/hooks/api_check.py):\n  " + "\n  ".join(found)
        )
    return config


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Expand the generated tables a page asks for."""
    return generated.expand(markdown)
