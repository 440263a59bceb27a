"""realbench's cache folder: the profiles of this machine (`realbench.runtime.profile_cache`) and
the datasets given through the Python API (`realbench.plan.data.saved_dataset`), under the user's
cache folder (`platformdirs.user_cache_dir("realbench")`) or `$REALBENCH_CACHE_DIR`."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "REALBENCH_CACHE_DIR"


def cache_folder() -> Path:
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("realbench"))
