"""Gallery thumbnails: the one recipe (JPEG, longer side at most ``px``) for the report and the
generation job, and the thumbnail a generation shard keeps beside each image (docs/outputs.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stereolens.atomic import atomic_path

DEFAULT_PX = 160
DEFAULT_QUALITY = 80
SHARD_DIR = "thumbs"
"""The folder of a generation shard that holds its thumbnails."""
_TAG = "stereolens-thumbnail"


def shard_thumbnail_path(image_path: str | Path) -> Path:
    """Where a generation shard keeps the thumbnail of its image ``image_path``."""
    image_path = Path(image_path)
    return image_path.parent / SHARD_DIR / f"{image_path.stem}.jpg"


def make_thumbnail(
    source: Any, out: str | Path, px: int, quality: int, sha256: str | None = None
) -> tuple[int, int]:
    """A JPEG of ``source`` (a file or PIL image), longer side at most ``px``, written
    atomically, its comment recording px, quality and ``sha256``; returns its size."""
    from PIL import Image

    if isinstance(source, Image.Image):
        rgb = _shrink(source.copy(), px)
    else:
        with Image.open(source) as im:
            rgb = _shrink(im, px)
    comment = f"{_TAG} px={px} quality={quality} sha256={sha256 or '-'}"
    with atomic_path(out, suffix=".jpg") as tmp:
        rgb.save(tmp, format="JPEG", quality=quality, comment=comment.encode())
    return rgb.size


def _shrink(im: Any, px: int) -> Any:
    from PIL import Image

    im.draft("RGB", (px, px))  # JPEG sources decode at a reduced size
    im.thumbnail((px, px), Image.Resampling.BICUBIC, reducing_gap=2.0)
    return im.convert("RGB")


def jpeg_size(path: str | Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as im:
        return im.size


def recorded(path: str | Path) -> tuple[dict[str, str], tuple[int, int]] | None:
    """What a thumbnail's comment records (px, quality, sha256) and its size, without
    decoding it; None when ``path`` is missing, unreadable or not made here."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            comment = im.info.get("comment", b"")
            size = im.size
    except (OSError, ValueError, SyntaxError):
        return None
    if isinstance(comment, bytes):
        comment = comment.decode("ascii", "replace")
    tag, *fields = comment.split()
    if tag != _TAG:
        return None
    return dict(f.split("=", 1) for f in fields if "=" in f), size


def shard_thumbnail(
    image_path: str | Path, px: int, quality: int, sha256: str | None = None
) -> tuple[Path, tuple[int, int]] | None:
    """The generation shard's thumbnail of ``image_path`` and its size, when it exists and
    was made at ``px`` and ``quality`` from this image: from the image whose sha256 is
    ``sha256`` when that is known, else (no hash to compare) when it is not older than the
    image file (the shard writes an image, then its thumbnail). None otherwise."""
    thumb = shard_thumbnail_path(image_path)
    got = recorded(thumb)
    if got is None:
        return None
    fields, size = got
    if fields.get("px") != str(px) or fields.get("quality") != str(quality):
        return None
    if sha256:
        if fields.get("sha256") != sha256:
            return None
    else:
        try:
            if thumb.stat().st_mtime_ns < Path(image_path).stat().st_mtime_ns:
                return None
        except OSError:
            return None
    return thumb, size
