import sys
from pathlib import Path

import pytest

# Tests import the model and graph zoo as `zoo`.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True, scope="session")
def _private_profile_cache(tmp_path_factory):
    """`autoplace plan` reads and writes the profile cache: never the user's, in tests."""
    mp = pytest.MonkeyPatch()
    mp.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path_factory.mktemp("profile-cache")))
    yield
    mp.undo()
