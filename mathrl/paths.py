"""Where the offline dataset copies live (stdlib only, shared by the CLI and the service)."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> str:
    """$MATHRL_DATA_DIR, else ../shared/datasets beside the checkout or the working directory."""
    if env := os.environ.get("MATHRL_DATA_DIR"):
        return env
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "shared" / "datasets", Path.cwd().parent / "shared" / "datasets"):
        if candidate.is_dir():
            return str(candidate)
    return str(here / "data")
