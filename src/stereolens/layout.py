"""A benchmark's output paths: named path templates under results/<benchmark>/, filled from
job keys (``path``), given to Snakemake as patterns (``pattern``) and read back (``parse``)."""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path, PurePosixPath
from types import MappingProxyType

ROOT = "results"
"""The folder every benchmark writes under (results/<benchmark>/...)."""


def image_shard(group: str, cell: str) -> str:
    """The template of a generation shard (the shared rule generate_images'), with the
    benchmark's names for the group and cell wildcards."""
    return "/".join(("images", "{model}", f"{{{group}}}", f"{{{cell}}}", "{shard}"))


READER_CORRECTION = MappingProxyType(
    {
        "human_labels_simulated": "human_labels_simulated.parquet",
        "corrected": "corrected.parquet",
    }
)
"""The templates of the shared `<benchmark> simulate-human-labels` and `correct` commands'
outputs (stereolens.metrics.command) in every benchmark with a reader correction."""


@dataclass(frozen=True)
class JobFolder:
    """A template of model-job outputs: their throughput stage and the key naming the model."""

    stage: str
    model_key: str = "model"


def extractor_jobs(template: str, stage: str) -> dict[str, JobFolder]:
    """The model-job templates of a benchmark whose images an extractor reads: the shared
    generation shards and the extractor's ``template`` under ``stage``."""
    return {"image_shard": JobFolder("generate"), template: JobFolder(stage, model_key="extractor")}


@dataclass(frozen=True)
class Parsed:
    """What :meth:`Layout.parse` reads from a path: the template's name and its keys."""

    name: str
    keys: dict[str, str]


@dataclass(frozen=True)
class Layout:
    """The output paths of one benchmark: ``templates``, name -> path under
    results/<benchmark>/ with ``{wildcards}`` (``layout.<name>`` its Snakemake pattern);
    ``jobs``: those whose files are model-job outputs."""

    benchmark: str
    templates: Mapping[str, str]
    jobs: Mapping[str, JobFolder] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "templates", MappingProxyType(dict(self.templates)))
        object.__setattr__(self, "jobs", MappingProxyType(dict(self.jobs)))
        taken = set(self.templates) & set(dir(type(self)))
        if taken:
            raise ValueError(f"layout {self.benchmark}: template names {taken} are methods")
        unknown = set(self.jobs) - set(self.templates)
        if unknown:
            raise ValueError(f"layout {self.benchmark}: job templates {unknown} are not templates")

    @property
    def base(self) -> str:
        """results/<benchmark> (results for the shared outputs' layout, named "")"""
        return f"{ROOT}/{self.benchmark}" if self.benchmark else ROOT

    def pattern(self, name: str) -> str:
        """The template ``name`` as a path pattern with its ``{wildcards}`` (Snakemake's)."""
        try:
            return f"{self.base}/{self.templates[name]}"
        except KeyError:
            raise KeyError(
                f"layout {self.benchmark} has no path {name!r}; it has {', '.join(self.templates)}"
            ) from None

    def __getattr__(self, name: str) -> str:
        # layout.extraction == layout.pattern("extraction"): short in the rules files
        if name.startswith("_") or name in ("templates", "jobs", "benchmark"):
            raise AttributeError(name)
        try:
            return self.pattern(name)
        except KeyError as err:
            raise AttributeError(str(err)) from None

    def __call__(self, name: str, **keys: object) -> str:
        """The pattern of template ``name`` with the wildcards in ``keys`` filled and the
        others left for Snakemake: layout("merged", table="images")."""
        unknown = set(keys) - set(self.keys(name))
        if unknown:
            raise KeyError(f"layout {self.benchmark}.{name} has no {', '.join(sorted(unknown))}")
        return "".join(
            literal + ("" if not key else str(keys[key]) if key in keys else f"{{{key}}}")
            for literal, key, _, _ in string.Formatter().parse(self.pattern(name))
        )

    def keys(self, name: str) -> list[str]:
        """The wildcards of template ``name``, in order."""
        return [f for _, f, _, _ in string.Formatter().parse(self.templates[name]) if f]

    def path(self, name: str, **keys: object) -> str:
        """Template ``name`` filled from ``keys`` (extra keys ignored, a missing one an error)."""
        missing = [k for k in self.keys(name) if k not in keys]
        if missing:
            raise KeyError(f"layout {self.benchmark}.{name} needs {', '.join(missing)}")
        return self.pattern(name).format(**keys)

    def at(self, results_dir: str | Path, name: str, **keys: object) -> Path:
        """The path of template ``name`` under another run's results folder (pilot, report)."""
        return Path(results_dir) / PurePosixPath(self.path(name, **keys)).relative_to(ROOT)

    @cached_property
    def _regexes(self) -> list[tuple[str, re.Pattern]]:
        out = []
        for name in self.templates:
            regex = ""
            for literal, key, _, _ in string.Formatter().parse(self.pattern(name)):
                regex += re.escape(literal)
                if key:
                    regex += f"(?P<{key}>[^/]+?)"
            out.append((name, re.compile(regex)))
        # the most literal template first: metrics/bi.parquet before metrics/{table}.parquet
        return sorted(out, key=lambda item: len(self.keys(item[0])))

    def parse(self, path: str) -> Parsed | None:
        """The template a path under results/<benchmark>/ fills, and its keys; None for a
        path of no template (a work folder, another benchmark's file)."""
        text = str(path).replace("\\", "/")
        for name, regex in self._regexes:
            found = regex.fullmatch(text)
            if found:
                return Parsed(name, found.groupdict())
        return None

    def job(self, path: str) -> tuple[str, Parsed] | None:
        """(stage, parsed) of a model job's output path; None for any other path."""
        parsed = self.parse(path)
        if parsed is None or parsed.name not in self.jobs:
            return None
        return self.jobs[parsed.name].stage, parsed

    def job_model(self, parsed: Parsed) -> str:
        """The model that ran the job whose output ``parsed`` is (its template's model key)."""
        return parsed.keys[self.jobs[parsed.name].model_key]

    def _job_rest(self, name: str) -> str:
        # the job template below its folder, without its file suffix
        rest = self.templates[name].partition("/")[2]
        return rest.removesuffix(PurePosixPath(rest).suffix)

    def log(self, name: str) -> str:
        """The log pattern of job template ``name``'s rule:
        logs/<benchmark>/<stage>/<the template below its folder>.log."""
        return f"logs/{self.benchmark}/{self.jobs[name].stage}/{self._job_rest(name)}.log"

    def bench(self, name: str) -> str:
        """The Snakemake benchmark-file pattern of job template ``name``'s rule:
        benchmarks/<benchmark>/<stage>/<the template below its folder>.tsv."""
        return f"benchmarks/{self.benchmark}/{self.jobs[name].stage}/{self._job_rest(name)}.tsv"

    def job_name(self, parsed: Parsed) -> str:
        """A job's name: its output's keys in its template below the folder (the path of its
        log under logs/<benchmark>/<stage>/, without .log)."""
        return self._job_rest(parsed.name).format(**parsed.keys)

    def job_base(self, name: str) -> str:
        """The folder of a job template's files (its fixed part: results/<benchmark>/<dir>)."""
        return self.pattern(name).split("{", 1)[0].rstrip("/")


GENERATION = Layout(
    "{benchmark}",
    {"image_shard": image_shard("group", "cell")},
    jobs={"image_shard": JobFolder("generate")},
)
"""The shared rule generate_images's output, for every generating benchmark (whose own
layout names the group and cell wildcards: :func:`image_shard`)."""

ADAPTIVE = Layout(
    "{benchmark}",
    {
        "round": "adaptive/round_{round}/{model}/decisions.parquet",
        "decisions": "adaptive/decisions.parquet",
    },
)
"""The adaptive design's tables (stereolens.design.rounds): a round's interim decisions per
group and the table of all rounds."""


def adaptive_table(benchmark: str) -> str:
    """The report's name of a benchmark's table of all rounds (stereolens.report.inputs)."""
    return f"{benchmark}_adaptive"


REPORT = Layout(
    "report",
    {
        "index": "index.html",
        "job_timings": "job_timings.parquet",
        "figures": "figures",
        "tables": "tables",
        "galleries": "galleries",
    },
)
"""The report's outputs (results/report/), which no benchmark owns."""

SHARED = Layout(
    "",
    {"check": "checks/{model}.tsv", "cache": "cache/{kind}"},
)
"""Outputs of the shared rules outside any benchmark's folder: a model's smoke check
(results/checks/) and the response caches (results/cache/)."""
