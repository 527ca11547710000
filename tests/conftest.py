import os
import sys
from pathlib import Path

import pytest

# Nothing in the test suite may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


def skip_unless_ci(reason: str) -> None:
    """Skip a test whose optional tool or model package is missing, except in CI: there
    `make test` installs every one of them from the repository's files, so a missing one
    is a broken install step and must fail instead of passing silently."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI installs it through the Makefile: the install step broke)")
    pytest.skip(reason)
