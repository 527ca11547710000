"""The files a report reads, by name: the rule render_report's inputs, and under any results
folder the paths of :func:`standard_paths` (the benchmark plug-ins' report_paths)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from stereolens.layout import ADAPTIVE, REPORT, ROOT, adaptive_table

RESULTS = f"{ROOT}/"
"""The workflow's results folder, the prefix of every layout's paths (stereolens.layout)."""


def standard_paths() -> dict[str, str]:
    """name -> path relative to a results folder of every file a report can read (each
    benchmark's report_paths, the adaptive tables and the job timings)."""
    from stereolens.benchmark import benchmarks

    out = {
        name: path.removeprefix(RESULTS)
        for plugin in benchmarks()
        for name, path in plugin.report_paths.items()
    }
    for plugin in benchmarks():  # the adaptive design's table of all rounds
        if plugin.rounds is not None:
            path = ADAPTIVE.path("decisions", benchmark=plugin.name)
            out[adaptive_table(plugin.name)] = path.removeprefix(RESULTS)
    return {**out, "job_timings": REPORT.job_timings.removeprefix(RESULTS)}


@contextmanager
def _named(path: Path, name: str):
    """A table that cannot be read is an error naming its file, whether it is damaged and
    the command that mends it (stereolens.damage), not polars' anonymous message."""
    try:
        yield
    except (pl.exceptions.PolarsError, OSError) as exc:
        from stereolens.damage import read_failure

        raise read_failure(path, exc, f"report table {name!r}") from exc


class Inputs:
    """The report's input files (name -> path); tables are read on first use and kept.
    A name that is absent, or whose file does not exist, reads as None."""

    def __init__(
        self,
        paths: Mapping[str, str | Path | None],
        roots: Sequence[str | Path] = (),
        models: Mapping[str, dict] | None = None,
    ):
        self.paths = {k: Path(v) for k, v in paths.items() if v}
        self.models = dict(models) if models is not None else None
        """name -> {"kind", "fingerprint"} of the run's models when the caller knows them
        (the workflow passes them as a param); None = read the registry file."""
        self.roots = [Path(r) for r in roots]
        """Folders a relative image path in a table may be relative to (the workflow's
        working directory, where tables record "results/..."), tried in order after the
        current directory."""
        self._frames: dict[str, pl.DataFrame | None] = {}
        self._given: dict[str, pl.DataFrame] = {}

    @classmethod
    def from_frames(
        cls,
        frames: Mapping[str, pl.DataFrame | None],
        paths: Mapping[str, str | Path | None] | None = None,
        roots: Sequence[str | Path] = (),
    ) -> Inputs:
        """Tables given as frames (bring-your-own tables, tests), plus files by path."""
        out = cls(paths or {}, roots=roots)
        out._given = {k: v for k, v in frames.items() if v is not None}
        return out

    @classmethod
    def from_results(
        cls, results: str | Path, extra: Mapping[str, str | Path | None] | None = None
    ) -> Inputs:
        """Every standard table found under the results folder ``results``."""
        root = Path(results)
        found = {k: root / rel for k, rel in standard_paths().items() if (root / rel).exists()}
        return cls({**found, **(extra or {})}, roots=[root.resolve().parent])

    def image_path(self, path: str) -> str:
        """A table's image path as a file that exists where it can be found (relative
        paths: the current directory, then each root); else the path as written."""
        p = Path(path)
        if p.is_absolute() or p.exists():
            return str(p)
        for root in self.roots:
            if (root / p).exists():
                return str(root / p)
        return str(p)

    def results_dir(self) -> Path | None:
        """The results folder the standard tables lie in, when they lie at their standard
        paths (None for tables gathered from elsewhere)."""
        for name, rel in standard_paths().items():
            path = self.paths.get(name)
            if path is not None and path.as_posix().endswith(rel):
                root = Path(path.as_posix()[: -len(rel)] or ".")
                if root.is_dir():
                    return root
        return None

    def has(self, name: str) -> bool:
        if name in self._given:
            return True
        path = self.paths.get(name)
        return path is not None and path.exists()

    def path(self, name: str) -> Path | None:
        path = self.paths.get(name)
        return path if path is not None and path.exists() else None

    def get(self, name: str, columns: Sequence[str] | None = None) -> pl.DataFrame | None:
        """The table ``name`` (all columns, kept for later calls), or only ``columns``
        of it (read each time: for the large tables galleries sample from)."""
        if not self.has(name):
            return None
        if name in self._given:
            frame = self._given[name]
            return frame if columns is None else frame.select(c for c in columns if c in frame)
        path = self.paths[name]
        with _named(path, name):
            if columns is not None:
                have = pl.read_parquet_schema(path)
                return pl.read_parquet(path, columns=[c for c in columns if c in have])
            if name not in self._frames:
                self._frames[name] = pl.read_parquet(path)
        return self._frames[name]

    def scan(self, name: str) -> pl.LazyFrame | None:
        if name in self._given:
            return self._given[name].lazy()
        return pl.scan_parquet(self.paths[name]) if self.has(name) else None

    def schema(self, name: str) -> dict[str, pl.DataType]:
        if name in self._given:
            return dict(self._given[name].schema)
        if not self.has(name):
            return {}
        with _named(self.paths[name], name):
            return dict(pl.read_parquet_schema(self.paths[name]))
