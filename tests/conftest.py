import os
import shutil
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


WORKFLOW_ITEMS = ("Snakefile", "workflow", "config", "profiles", "envs", ".test")
"""What a copy of the workflow needs (tests that run Snakemake work in a copy)."""


def copy_workflow(dest: Path, root: Path = ROOT) -> Path:
    """A copy of the workflow's files under ``dest`` (created), symlinks kept."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in WORKFLOW_ITEMS:
        src = root / item
        if src.is_dir():
            shutil.copytree(src, dest / item, symlinks=True)
        elif src.exists():
            shutil.copy2(src, dest / item)
    return dest


def workflow_env(**extra: str) -> dict[str, str]:
    """The environment a test's Snakemake or stereolens subprocess runs in: this Python's
    bin first on PATH, no hub access, plus ``extra``."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    env.update(extra)
    return env
