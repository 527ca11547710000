"""First-build gallery thumbnail time with and without generation-time thumbnails (#14).

Makes ``--images`` synthetic 1024x1024 PNGs (noise + gradients, about the size of real
generated images), measures: the generation job's extra cost per image (the thumbnail made
from the in-memory image), and the report's first-build thumbnail step (empty cache) on
shards without thumbnails (every PNG decoded, as before) and with them (copied), on
``--threads`` worker processes. Prints one JSON line, with a linear extrapolation to
``--scale`` images (paper scale: 5,284). Usage: python bench/shard_thumbnails.py --images 200
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path


def _image(k: int):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(k)
    y, x = np.mgrid[0:1024, 0:1024]
    base = np.stack([(x + k) % 256, (y * 2 + k) % 256, ((x + y) // 3) % 256], axis=-1)
    noise = rng.integers(0, 48, size=(1024, 1024, 3))
    return Image.fromarray(((base + noise) % 256).astype("uint8"), "RGB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scale", type=int, default=5284)
    args = ap.parse_args()

    from stereolens.ids import sha256_file
    from stereolens.report.galleries import ImageRef, thumbnails
    from stereolens.thumbnails import (
        DEFAULT_PX,
        DEFAULT_QUALITY,
        make_thumbnail,
        shard_thumbnail_path,
    )

    root = Path(tempfile.mkdtemp(prefix="shard-thumbs-"))
    try:
        refs, extra = [], 0.0
        for k in range(args.images):
            im = _image(k)
            png = root / "shard" / f"img{k:04d}.png"
            png.parent.mkdir(parents=True, exist_ok=True)
            im.save(png, format="PNG")
            sha = sha256_file(png)
            t0 = time.perf_counter()
            make_thumbnail(im, shard_thumbnail_path(png), DEFAULT_PX, DEFAULT_QUALITY, sha)
            extra += time.perf_counter() - t0
            refs.append(ImageRef(str(png), sha))
        out = {"images": args.images, "threads": args.threads}
        out["generation_ms_per_image"] = round(1000 * extra / args.images, 2)
        for label, keep in (("with_shard_thumbs", True), ("without", False)):
            if not keep:
                shutil.rmtree(root / "shard" / "thumbs")
            cache = root / f"cache-{label}"
            t0 = time.perf_counter()
            made = thumbnails(refs, root / f"g-{label}", DEFAULT_PX, DEFAULT_QUALITY, cache,
                              args.threads)  # fmt: skip
            seconds = time.perf_counter() - t0
            assert all(made.values())
            out[f"{label}_s"] = round(seconds, 2)
            out[f"{label}_s_at_scale"] = round(seconds * args.scale / args.images, 1)
        print(json.dumps(out))
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
