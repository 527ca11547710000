"""Gallery pages beside the report: cards of sample images (JPEG thumbnails) or responses with
what the pipeline recorded, thumbnails made in parallel from a content-keyed cache, and the
seeded per-group draw (:func:`draw`). Imports no benchmark."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from stereolens.atomic import write_text
from stereolens.report.html import render_template, slug
from stereolens.thumbnails import DEFAULT_PX, DEFAULT_QUALITY


@dataclass(frozen=True)
class ImageRef:
    """An image a card shows: its file and, when known, its sha256 (the thumbnail cache
    key; without it the file's path, size and modification time are)."""

    path: str
    sha256: str | None = None


@dataclass
class Card:
    badge: str
    headline: str
    fields: list[tuple[str, str]]
    image: ImageRef | None = None
    alt: str = "image"
    css: str = ""
    text: str = ""
    details_label: str = "details"
    thumb: str = ""
    width: int = 0
    height: int = 0


@dataclass
class Group:
    title: str
    cards: list[Card]
    note: str = ""
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or "g-" + slug(self.title)


@dataclass
class GalleryPage:
    """One side page: ``name`` its file stem (galleries/<name>.html)."""

    name: str
    title: str
    groups: list[Group]
    paragraphs: list[str] = field(default_factory=list)
    summary: str = ""
    """One line for the report's list of galleries."""
    layout: str = "images"
    """"images" (a grid of thumbnails) or "responses" (a small photo beside a text)."""

    @property
    def file_name(self) -> str:
        return f"{slug(self.name)}.html"

    def n_cards(self) -> int:
        return sum(len(g.cards) for g in self.groups)


@dataclass(frozen=True)
class GallerySettings:
    """The config's report.galleries: the shared keys, and in ``counts`` the sample sizes
    the benchmarks' schemas add (x-report-galleries, e.g. contextbias_per_set)."""

    thumbnail_px: int = DEFAULT_PX
    jpeg_quality: int = DEFAULT_QUALITY
    seed: int = 0
    enabled: bool = True
    counts: Mapping[str, int] = field(default_factory=dict)

    def count(self, key: str, default: int) -> int:
        """A benchmark's sample size ``key``; ``default`` where the config has none."""
        return self.counts.get(key, default)

    @classmethod
    def from_config(cls, config: dict) -> GallerySettings:
        g = config["report"]["galleries"]
        shared = {k: g[k] for k in cls.__dataclass_fields__ if k in g and k != "counts"}
        return cls(**shared, counts={k: v for k, v in g.items() if k not in shared})


# ------------------------------------------------------------------ sampling


def draw(frame: pl.DataFrame, by: Sequence[str], key: str, n: int, seed: int = 0) -> pl.DataFrame:
    """At most ``n`` rows per group of ``by``: those whose sha256 of (seed, key value) is
    smallest (a stable pseudo-random draw, independent of row order and of other groups)."""
    if frame.is_empty() or n <= 0:
        return frame.clear()
    values = frame[key].cast(pl.String).to_list()
    prefix = f"{seed}\x1f".encode()
    rank = [hashlib.sha256(prefix + str(v).encode()).hexdigest()[:16] for v in values]
    ranked = frame.with_columns(pl.Series("_rank", rank))
    return ranked.sort([*by, "_rank"]).group_by(list(by), maintain_order=True).head(n).drop("_rank")


# ------------------------------------------------------------------ thumbnails


def _cache_key(ref: ImageRef, px: int, quality: int) -> str:
    if ref.sha256:
        base = ref.sha256
    else:
        try:
            st = os.stat(ref.path)
            base = f"{os.path.abspath(ref.path)}\x1f{st.st_size}\x1f{st.st_mtime_ns}"
        except OSError:
            base = os.path.abspath(ref.path)
    return hashlib.sha256(f"{base}\x1f{px}\x1f{quality}".encode()).hexdigest()[:24]


def _place(cached: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        return
    try:
        os.link(cached, target)
    except OSError:
        shutil.copyfile(cached, target)


def thumbnails(
    refs: Sequence[ImageRef],
    thumbs_dir: Path,
    px: int,
    quality: int,
    cache_dir: Path | None = None,
    threads: int = 1,
) -> dict[ImageRef, tuple[str, int, int] | None]:
    """ref -> (file name in ``thumbs_dir``, width, height), None for an unreadable image;
    reuses ``cache_dir``'s or the shard's thumbnail; ``threads``: worker processes."""
    from stereolens.report.thumbs import from_shard, thumbnail_job

    unique = list(dict.fromkeys(refs))
    keys = [_cache_key(r, px, quality) for r in unique]
    home = [
        (cache_dir / k[:2] / f"{k}.jpg") if cache_dir is not None else thumbs_dir / f"{k}.jpg"
        for k in keys
    ]
    jobs = [(r.path, str(h), px, quality, r.sha256) for r, h in zip(unique, home, strict=True)]
    sizes: dict[str, tuple[int, int] | None] = {}
    todo = []
    for j in (j for j in jobs if not Path(j[1]).exists()):
        # the generation shard's own thumbnail, when it fits: a copy, no PNG decoded
        size = from_shard(*j)
        if size is None:
            todo.append(j)
        else:
            sizes[j[1]] = size
    if threads > 1 and len(todo) > 16:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context("spawn")  # no fork of a threaded process
        with ProcessPoolExecutor(max_workers=threads, mp_context=context) as pool:
            sizes.update(zip((j[1] for j in todo), pool.map(thumbnail_job, todo, chunksize=32),
                             strict=True))  # fmt: skip
    else:
        sizes.update((j[1], thumbnail_job(j)) for j in todo)
    out: dict[ImageRef, tuple[str, int, int] | None] = {}
    for ref, key, job in zip(unique, keys, jobs, strict=True):
        size = sizes[job[1]] if job[1] in sizes else thumbnail_job(job)
        if size is None:
            out[ref] = None
            continue
        name = f"{key}.jpg"
        if cache_dir is not None:
            _place(Path(job[1]), thumbs_dir / name)
        out[ref] = (name, *size)
    return out


# ------------------------------------------------------------------ pages


def write_galleries(
    pages: Sequence[GalleryPage],
    out_dir: str | Path,
    settings: GallerySettings,
    *,
    back: str = "../index.html#galleries",
    cache_dir: str | Path | None = None,
    threads: int = 1,
    version: str = "",
) -> dict[str, int]:
    """Write every page into ``out_dir`` (galleries/), thumbnails into out_dir/thumbs.
    Returns counts: pages, cards, thumbnails, unreadable images."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    refs = [c.image for p in pages for g in p.groups for c in g.cards if c.image is not None]
    made = thumbnails(
        refs,
        out / "thumbs",
        settings.thumbnail_px,
        settings.jpeg_quality,
        Path(cache_dir) if cache_dir else None,
        threads,
    )
    unreadable = 0
    for page in pages:
        for group in page.groups:
            for card in group.cards:
                if card.image is None:
                    continue
                got = made.get(card.image)
                if got is None:
                    unreadable += 1
                    card.fields.append(("image", f"{card.image.path} cannot be read"))
                    card.css = (card.css + " unreadable").strip()
                    continue
                name, card.width, card.height = got
                card.thumb = f"thumbs/{name}"
        text = render_template(
            "gallery.html.j2",
            page=_PageView(page, settings.thumbnail_px, back),
            version=version,
        )
        write_text(out / page.file_name, text)
    return {
        "pages": len(pages),
        "cards": sum(p.n_cards() for p in pages),
        "thumbnails": sum(v is not None for v in made.values()),
        "unreadable": unreadable,
    }


@dataclass
class _PageView:
    page: GalleryPage
    thumb_px: int
    back: str

    def __getattr__(self, name):
        return getattr(self.page, name)
