"""Image helpers shared by the VLM request builders and the annotation form."""

from __future__ import annotations

from pathlib import Path


def load_image(path: str | Path, max_side: int | None = None):
    """Open an image as RGB PIL (decoded and re-made, so PNG text chunks and EXIF are
    gone), downscaled so its longer side is at most ``max_side``."""
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        image = im.convert("RGB")
    if max_side and max(image.size) > max_side:
        scale = max_side / max(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    return image
