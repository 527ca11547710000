"""JPEG thumbnails of gallery images, made in worker processes.

PNG decoding holds Python's GIL, so threads do not make thumbnails faster; processes do.
This module imports only Pillow (a spawned worker starts in a fraction of a second), and
each thumbnail is written atomically under a name derived from its image's content key,
so a cache folder can be shared by every report build."""

from __future__ import annotations

import os
from pathlib import Path


def make_thumbnail(source: str | Path, out: str | Path, px: int, quality: int) -> tuple[int, int]:
    """A JPEG of ``source`` whose longer side is at most ``px`` (RGB, metadata dropped),
    written atomically; returns (width, height)."""
    from PIL import Image

    out = Path(out)
    with Image.open(source) as im:
        im.draft("RGB", (px, px))  # JPEG sources decode at a reduced size
        im.thumbnail((px, px), Image.Resampling.BICUBIC, reducing_gap=2.0)
        rgb = im.convert("RGB")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    rgb.save(tmp, format="JPEG", quality=quality)
    os.replace(tmp, out)
    return rgb.size


def jpeg_size(path: str | Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as im:
        return im.size


def thumbnail_job(job: tuple[str, str, int, int]) -> tuple[int, int] | None:
    """(source, out, px, quality) -> the thumbnail's size, or None when the source cannot
    be read. An existing ``out`` (a cached thumbnail) is reused."""
    source, out, px, quality = job
    try:
        if Path(out).exists():
            return jpeg_size(out)
        return make_thumbnail(source, out, px, quality)
    except (OSError, ValueError, SyntaxError):
        return None
