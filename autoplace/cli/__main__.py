"""``python -m autoplace.cli``: the ``autoplace`` command, as benchmarks and tests run it."""

from __future__ import annotations

import sys

from autoplace.cli import main

sys.exit(main())
