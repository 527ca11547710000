"""JPEG thumbnails of gallery images, made in worker processes (PNG decoding holds the GIL),
written atomically under their image's content key, or copied from the generation shard."""

from __future__ import annotations

from pathlib import Path

from stereolens.atomic import write_bytes
from stereolens.thumbnails import jpeg_size, make_thumbnail, shard_thumbnail

__all__ = ["jpeg_size", "make_thumbnail", "thumbnail_job", "from_shard"]


def from_shard(
    source: str, out: str, px: int, quality: int, sha256: str | None
) -> tuple[int, int] | None:
    """Copy the generation shard's thumbnail of ``source`` to ``out`` (atomically) when the
    shard has one that fits (stereolens.thumbnails.shard_thumbnail); its size, else None."""
    found = shard_thumbnail(source, px, quality, sha256)
    if found is None:
        return None
    thumb, size = found
    try:
        write_bytes(out, thumb.read_bytes())
    except OSError:
        return None
    return size


def thumbnail_job(
    job: tuple[str, str, int, int] | tuple[str, str, int, int, str | None],
) -> tuple[int, int] | None:
    """(source, out, px, quality[, sha256]) -> the thumbnail's size (an existing ``out``, the
    shard's copied, or one made), or None when the source cannot be read."""
    source, out, px, quality, *rest = job
    sha256 = rest[0] if rest else None
    try:
        if Path(out).exists():
            return jpeg_size(out)
        size = from_shard(source, out, px, quality, sha256)
        if size is not None:
            return size
        return make_thumbnail(source, out, px, quality, sha256)
    except (OSError, ValueError, SyntaxError):
        return None
