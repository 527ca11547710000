"""Render the report: index.html with figures/, tables/ and galleries/ beside it (docs/outputs.md),
its sections from the benchmarks' report modules in plug-in order, then :data:`EXTRA_SECTIONS`
and the run section."""

from __future__ import annotations

import importlib
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

import polars as pl

from stereolens import __version__
from stereolens.atomic import write_bytes, write_text
from stereolens.benchmark import benchmarks
from stereolens.report import adaptive, comparisons, reader, reader_plan, run
from stereolens.report.galleries import GalleryPage, GallerySettings, write_galleries
from stereolens.report.html import (
    Figure,
    Link,
    Section,
    Table,
    check_ids,
    csv_ready,
    render_template,
)
from stereolens.report.inputs import Inputs
from stereolens.report.summary import (
    ProfileView,
    profile_figure,
    profile_frame,
    profile_view,
    tiny_model_warning,
    versions,
)

log = logging.getLogger(__name__)


def benchmark_modules() -> list[ModuleType]:
    """The report module of every registered benchmark (its plug-in's ``report_sections``),
    in page order, enabled or not (a module's ``enabled`` decides from the tables)."""
    return [importlib.import_module(p.report_sections) for p in benchmarks() if p.report_sections]


SectionProvider = Callable[[Inputs, dict], list[Section]]

EXTRA_SECTIONS: list[SectionProvider] = []
"""Sections shown after the benchmarks' and before the run's: append a function
(inputs, config) -> list[Section] (or pass ``extra_sections`` to :func:`render_report`)."""


@dataclass
class Summary:
    facts: list[tuple[str, list[str]]]
    warnings: list[str]
    profile: ProfileView
    figure: Figure | None
    comparisons: list = field(default_factory=list)
    """stereolens.report.comparisons.Block per benchmark with model comparisons."""
    reader: list = field(default_factory=list)
    """stereolens.report.reader.ReaderBlock per benchmark whose report module has the
    ``reader_correction`` hook: naive beside corrected, or the labels to collect."""


@dataclass
class Report:
    run: dict
    summary: Summary
    sections: list[Section]
    galleries: list[GalleryPage] = field(default_factory=list)

    def figures(self) -> list[Figure]:
        out = [self.summary.figure] if self.summary.figure else []
        return out + [f for top in self.sections for s in top.walk() for f in s.figures]

    def tables(self) -> list[Table]:
        return [t for top in self.sections for s in top.walk() for t in s.tables]


def build_report(
    inputs: Inputs,
    config: dict,
    *,
    extra_sections: Sequence[SectionProvider] = (),
    galleries: bool = True,
    shown_config: dict | None = None,
) -> Report:
    """Everything the page shows, as data; ``shown_config``: the run section's, if not config."""
    entries = run.registry_entries(inputs, config)
    modules = benchmark_modules()
    active = [b for b in modules if b.enabled(inputs, config)]
    profiles = [b.profile(inputs, config) for b in active]
    profile = pl.concat(profiles) if profiles else profile_frame([])
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    facts: list[tuple[str, list[str]]] = []
    for b in modules:
        facts.append((b.TITLE, b.facts(inputs, config) if b in active else ["not in this run"]))
    # model roles a benchmark's box does not name (its report module's optional OTHER_ROLES)
    other = {role for b in modules for role in getattr(b, "OTHER_ROLES", ())}
    extra = [f"{role}: {name}" for role, name in run.model_roles(config) if role in other]
    if extra:
        facts.append(("Other models", extra))
    warnings = [w for w in (tiny_model_warning(config, run.tiny_models(config, entries)),) if w]
    readers = reader.blocks(inputs, config, active)
    summary = Summary(
        facts, warnings, profile_view(profile), profile_figure(profile),
        comparisons.blocks(inputs, active), readers,
    )  # fmt: skip
    sections: list[Section] = []
    for b in active:
        sections += b.sections(inputs, config)
    compared = comparisons.section(inputs, active)
    if compared is not None:
        sections.append(compared)
    corrected = reader.section(readers)
    if corrected is not None:
        sections.append(corrected)
    sections += adaptive.section(inputs, config)
    for provider in (*EXTRA_SECTIONS, *extra_sections):
        sections += [s for s in provider(inputs, config) if not s.is_empty()]
    pages: list[GalleryPage] = []
    settings = GallerySettings.from_config(config)
    if galleries and settings.enabled:
        for b in active:
            got = b.galleries(inputs, config, settings)
            pages += got
            target = next((s for s in sections if s.id == b.KEY), None)
            if target is not None and got:
                target.links += [Link(f"galleries/{p.file_name}", p.title, p.summary) for p in got]
        if pages:
            sections.append(
                Section(
                    "galleries",
                    "Galleries",
                    paragraphs=[
                        "Sample images and responses beside what the pipeline recorded about "
                        "them (side pages in galleries/, JPEG thumbnails of "
                        f"{settings.thumbnail_px} px)."
                    ],
                    links=[Link(f"galleries/{p.file_name}", p.title, p.summary) for p in pages],
                )
            )
    sections += run.sections(inputs, config, shown_config)
    check_ids(sections)
    line = f"Written {now} · {versions()}" + (
        f" · registry {config['registry']}" if config.get("registry") else ""
    )
    return Report(
        run={
            "label": config["run_label"],
            "line": line,
            "footer": f"stereolens {__version__}; {now}.",
        },
        summary=summary,
        sections=sections,
        galleries=pages,
    )


def _clear(folder: Path, patterns: Sequence[str]) -> None:
    """Remove earlier report files (only the kinds this module writes) from ``folder``."""
    if not folder.is_dir():
        return
    for pattern in patterns:
        for path in folder.glob(pattern):
            if path.is_file():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)


def render_report(
    config: dict,
    inputs: Mapping[str, str] | Inputs,
    out_path: str | Path,
    *,
    extra_sections: Sequence[SectionProvider] = (),
    cache_dir: str | Path | None = None,
    threads: int = 1,
    galleries: bool = True,
    shown_config: dict | None = None,
) -> dict:
    """Write index.html to ``out_path`` with figures/, tables/ and galleries/ beside it
    (``cache_dir``: thumbnails kept between runs); returns paths, counts and seconds."""
    t0 = time.perf_counter()
    if not isinstance(inputs, Inputs):
        inputs = Inputs(inputs, roots=[Path.cwd()])
    report = build_report(
        inputs, config, extra_sections=extra_sections, galleries=galleries,
        shown_config=shown_config,
    )  # fmt: skip
    t_build = time.perf_counter()
    out = Path(out_path)
    root = out.parent
    root.mkdir(parents=True, exist_ok=True)
    figures_dir, tables_dir, galleries_dir = root / "figures", root / "tables", root / "galleries"
    for folder, patterns in (
        (figures_dir, ["*.png"]),
        (tables_dir, ["*.csv"]),
        (galleries_dir, ["*.html", "thumbs"]),
    ):
        _clear(folder, patterns)
        folder.mkdir(parents=True, exist_ok=True)
    for fig in report.figures():
        write_bytes(figures_dir / fig.file_name, fig.png)
    csv_frame = csv_ready(report.summary.profile.frame)
    write_text(tables_dir / report.summary.profile.file_name, csv_frame.write_csv())
    for table in report.tables():
        write_text(tables_dir / table.file_name, table.csv_frame().write_csv())
    settings = GallerySettings.from_config(config)
    counts = write_galleries(
        report.galleries, galleries_dir, settings, cache_dir=cache_dir, threads=threads,
        version=__version__,
    )  # fmt: skip
    t_galleries = time.perf_counter()
    html = render_template(
        "report.html.j2",
        run=report.run,
        summary=report.summary,
        sections=report.sections,
        max_rows=config["report"]["max_table_rows"],
        tables_href="tables",
        reader_caption=(
            reader.caption() if any(b.has_labels for b in report.summary.reader) else ""
        ),
        reader_plan_caption=reader_plan.PLAN_CAPTION,
        version=__version__,
    )
    write_text(out, html)
    t_end = time.perf_counter()
    return {
        "index": out,
        "figures": len(report.figures()),
        "tables": len(report.tables()) + 1,
        "sections": len(report.sections),
        "index_bytes": out.stat().st_size,
        "seconds": {
            "build": t_build - t0,
            "galleries": t_galleries - t_build,
            "page": t_end - t_galleries,
            "total": t_end - t0,
        },
        **{f"gallery_{k}": v for k, v in counts.items()},
    }
