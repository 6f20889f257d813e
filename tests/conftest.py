"""Shared test set-up: the test directory on ``sys.path`` (for ``zoo`` and ``report_browser``),
a private profile cache for every session, and ``require``, the one way a test says it needs a
tool or data set that may be missing: skipped on a developer's machine, failed under ``CI=true``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Tests import the model and graph zoo as `zoo`.
sys.path.insert(0, str(Path(__file__).parent))


def require(condition: bool, reason: str) -> None:
    """Go on when ``condition`` holds. Otherwise skip the test with ``reason`` or, when the
    environment says ``CI=true``, fail it: CI installs every tool and data set, so a missing one
    there is a broken set-up that a skip would hide."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: CI must provide it, so this fails instead of skipping)",
                    pytrace=False)
    pytest.skip(reason)


@pytest.fixture(autouse=True, scope="session")
def _private_profile_cache(tmp_path_factory):
    """`autoplace plan` reads and writes the profile cache: never the user's, in tests."""
    mp = pytest.MonkeyPatch()
    mp.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path_factory.mktemp("profile-cache")))
    yield
    mp.undo()
