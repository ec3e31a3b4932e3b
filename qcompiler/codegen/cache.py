"""Where the code generator keeps what it builds once per machine (the CUDA driver stub, the aarch64
runtime)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$QCOMPILER_CACHE_DIR``, else ``$XDG_CACHE_HOME/qcompiler``, else ``~/.cache/qcompiler``."""
    if os.environ.get("QCOMPILER_CACHE_DIR"):
        return Path(os.environ["QCOMPILER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qcompiler"
