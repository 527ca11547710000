"""Image helpers shared by the VLM request builders and the annotation form."""

from __future__ import annotations

from pathlib import Path


class ImageUnreadable(ValueError):
    """An image file that cannot be opened or decoded (missing, truncated, not an image)."""


def load_image(path: str | Path, max_side: int | None = None):
    """An image as RGB PIL, re-made without metadata, its longer side at most ``max_side``;
    ImageUnreadable naming the file when it cannot be read or decoded."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            image = im.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        # PIL raises OSError for truncated files, UnidentifiedImageError (an OSError) for
        # non-images, SyntaxError/ValueError for some broken headers
        raise ImageUnreadable(f"image {path} cannot be read: {type(exc).__name__}: {exc}") from exc
    if max_side and max(image.size) > max_side:
        scale = max_side / max(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    return image
