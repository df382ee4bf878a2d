"""Where the offline dataset copies live (stdlib only, shared by the CLI and the service)."""

from __future__ import annotations

import os
import sys
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


def example_file(name: str) -> Path:
    """A file of the project's examples/: the checkout's, else the installed copy (a wheel installs
    examples/*.yaml under <prefix>/share/mathrl/examples: pyproject.toml's data-files), so
    `mathrl-server demo` and `python -m service.gpu_check` find theirs inside an image too."""
    here = Path(__file__).resolve().parent.parent / "examples" / name
    if here.exists():
        return here
    installed = Path(sys.prefix) / "share" / "mathrl" / "examples" / name
    return installed if installed.exists() else here
