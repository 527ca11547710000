"""Headless Chromium for the report: a screenshot of the first screen (and the binaries
the browser tests drive). Debian's ``chromium`` and ``chromium-driver`` packages provide
them (.ci/run installs both)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

FIRST_SCREEN = (1280, 900)
"""Width x height (CSS pixels) of "the first screen" of a laptop."""

SCREENSHOT_NAME = "first-screen.png"


def chromium_binary() -> str | None:
    """The Chromium (or Chrome) executable: $STEREOLENS_CHROMIUM, else the first on PATH."""
    env = os.environ.get("STEREOLENS_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def chromedriver_binary() -> str | None:
    return os.environ.get("STEREOLENS_CHROMEDRIVER") or shutil.which("chromedriver")


def screenshot(
    page: str | Path,
    out: str | Path | None = None,
    size: tuple[int, int] = FIRST_SCREEN,
    timeout: float = 60,
) -> Path:
    """Write a PNG of the first ``size`` pixels of ``page`` with headless Chromium (default
    first-screen.png beside it); returns its path. RuntimeError without Chromium."""
    binary = chromium_binary()
    if binary is None:
        raise RuntimeError(
            "no Chromium found for the screenshot: install Debian's chromium package "
            "(apt-get install chromium) or set STEREOLENS_CHROMIUM"
        )
    page = Path(page).resolve()
    target = Path(out) if out else page.parent / SCREENSHOT_NAME
    with tempfile.TemporaryDirectory(prefix="stereolens-chromium-") as profile:
        tmp = Path(profile) / "shot.png"
        proc = subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
             f"--screenshot={tmp}", page.as_uri()],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if proc.returncode != 0 or not tmp.exists():
            raise RuntimeError(f"chromium could not screenshot {page}: {proc.stderr[-2000:]}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(tmp), target)
    return target
