"""Where the real client CLIs are: $<NAME>_BIN, else what `make test-cli` installed into .venv/cli, else PATH."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli_binary(name: str) -> str | None:
    installed = ROOT / ".venv" / "cli" / "node_modules" / ".bin" / name
    for candidate in (os.environ.get(f"{name.upper()}_BIN"), str(installed)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)


def cli_marks(binary: str | None, name: str) -> list[pytest.MarkDecorator]:
    """Mark a module's tests `cli` (left out of `make test`) and skip them without the binary."""
    return [pytest.mark.cli,
            pytest.mark.skipif(binary is None, reason=f"{name} CLI not installed (make test-cli installs it)")]
