"""``python -m transports.cli``: the same as the ``nsq-sansio`` command."""

from __future__ import annotations

import sys

from .main import main

sys.exit(main())
