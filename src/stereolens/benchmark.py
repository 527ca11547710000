"""What a benchmark plug-in is (:class:`Benchmark`, declared as an entry point of the group
``stereolens.benchmarks``), and the table of the registered ones, imported lazily
(docs/architecture.md, "A benchmark is a plug-in")."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stereolens.layout import Layout

ENTRY_POINT_GROUP = "stereolens.benchmarks"

BUILT_IN: dict[str, str] = {
    "contextbias": "stereolens.contextbias.plugin:BENCHMARK",
    "biasig": "stereolens.biasig.plugin:BENCHMARK",
    "lvlm": "stereolens.lvlm.plugin:BENCHMARK",
}
"""The built-in benchmarks (also declared as entry points in pyproject.toml): known even where
the installed metadata predates the entry-point group (an editable install made before it)."""


@dataclass(frozen=True)
class Job:
    """One model job of the workflow: the unit of a SLURM submission and of the plan."""

    rule: str
    """The workflow rule that runs it."""
    stage: str
    """generate, extract, vqa, respond or assistant: a row of the plan."""
    model: str
    """The registry model the job runs."""
    output: str
    """The job's output path, exactly as its rule names it."""
    items: int = 0
    """Images it makes or requests it sends (first attempts); 0 where not counted."""
    unit: str = "images"
    """What ``items`` counts: images (generated or read) or calls (text requests)."""
    wildcards: dict[str, Any] = field(default_factory=dict)
    """The rule's wildcards of this job (for input functions that select jobs)."""


@dataclass(frozen=True)
class Size:
    """The model jobs of one stage and model of a run, counted without a job list."""

    stage: str
    model: str
    jobs: int
    items: int
    """Images made or read, or calls (``unit``), as Job.items sums them."""
    unit: str = "images"


@dataclass(frozen=True)
class Rounds:
    """How a benchmark runs in rounds under ``design.mode: adaptive`` (docs/planner.md
    "Adaptive design"): its sharded model jobs split into rounds of cumulative shards, the
    interim analysis ``interim`` deciding per cell whether the next round is made."""

    interim: str
    """"module:function" of the interim estimate: ``function(config, paths)`` reads the
    outputs ``paths`` of its ``reads`` jobs (rounds 1..r of the open cells of one model)
    and returns a polars frame with one row per cell: the cell's keys (``keys``), ``cell``
    (its name), ``effect`` (the headline effect's planner name, for design.adaptive.width
    and margin), ``estimate``, ``se`` and ``df`` (degrees of freedom of its interval's t
    quantile; null = normal)."""
    reads: str
    """The stage of the jobs whose outputs the interim reads (e.g. ``extract``)."""
    keys: tuple[str, ...] = ("model",)
    """The wildcards naming a cell (the first, the round's group: one checkpoint per value);
    a job belongs to a cell when it agrees on the keys it has (a generation job, without an
    extractor, belongs to every extractor's cell of its model)."""
    shards: Callable[[dict], int] | None = None
    """``shards(config)``: the shards of a cell at the configured size."""
    capped: Callable[[dict, int], dict] | None = None
    """``capped(config, n)``: ``config`` with ``n`` shards per cell (fewer than configured:
    the size ``design.adaptive.gpu_hours_cap`` affords; stereolens.design.rounds.budget)."""
    in_rounds: Callable[[Job], bool] | None = None
    """Whether a job is part of the rounds; the others run in full as in the fixed design
    (ContextBias's validation prompts); None: every job with a ``shard``."""
    shard_key: str = ""
    """The config key that sets a shard's size (named when its shards allow one round
    only)."""
    settings: tuple[str, ...] = ()
    """Keys of its config section the interim reads (a param of the rounds' rule: a change
    reruns them; a change elsewhere in the section, such as a model added, does not)."""


@dataclass(frozen=True)
class Benchmark:
    """A benchmark plug-in. The callables take the validated run config (and where named the
    loaded registry); each returns plain data."""

    name: str
    """Its config section and its folder under results/."""
    title: str
    enabled: Callable[[dict], bool]
    check: Callable[[dict, dict], None]
    """Raise ConfigError naming the key when the config names a model the registry lacks (or
    of the wrong kind) or the benchmark's own input is wrong (read at parse time)."""
    jobs: Callable[..., list[Job]]
    """``jobs(config, counts=False)``: every model job; ``counts=True`` also fills
    ``items`` (the planner's figures)."""
    targets: Callable[[dict], list[str]]
    """The benchmark's final outputs (rule all): its results and the audits of its own
    measurements (the validation group gaps, the story reading)."""
    models: Callable[[dict], dict[str, list[str]]]
    """Role of a model in this run (generator, extractor, vqa, lvlm, assistant, ...) -> the
    registry names: the report's Models table, the measured throughput, check-models."""
    report_tables: Callable[[dict], dict[str, str]] | None = None
    """Table name -> path of every file the report reads for this benchmark (all of them
    declared as inputs of the report rule under these names, which
    stereolens.report.inputs reads; no two benchmarks share a name); None: all of
    :attr:`report_paths`, whatever the config."""
    generation_items: str | None = None
    """"module:function" turning the benchmark's prompt table and a generation job's
    wildcards into images to make (stereolens.generate.job), or None: the benchmark
    generates no images (then the two below are None too)."""
    generation_prompts: Callable[[dict], str] | None = None
    """The prompt input of the benchmark's generation jobs (rule generate_images), a path."""
    generation_settings: Callable[[dict, str, str], str] | None = None
    """``generation_settings(config, model, cell)``: canonical JSON of what decides a
    generation shard's images besides the model (a param of generate_images: a change
    reruns exactly the shards it affects)."""
    report_paths: dict[str, str] = field(default_factory=dict)
    """Table name -> path of every file the benchmark can give the report, whatever the
    config (``stereolens report --results DIR`` looks for them there);
    ``report_tables(config)`` is the part of it a run writes."""
    unordered_models: tuple[str, ...] = ()
    """Keys of the benchmark's config section that list models in an order that changes
    no result (the report's config is shown with them sorted, so reordering reruns
    nothing)."""
    report_sections: str | None = None
    """The dotted name of the module that renders the benchmark's part of the report:
    ``KEY``, ``TITLE``, ``enabled``, ``facts``, ``profile``, ``sections``, ``galleries``
    and optionally ``OTHER_ROLES`` (stereolens.report.render); None: no report part."""
    size: Callable[[dict], list[Size]] | None = None
    """``size(config)``: the counts of :attr:`jobs` per stage and model, by arithmetic (the
    ceiling check reads it before any job list exists)."""
    rules: tuple[str, ...] = ()
    """Its Snakemake rules files, in the order the Snakefile includes them (input functions
    first): a relative path is one under the workflow's folder (the Snakefile's), an
    absolute one a file shipped in the benchmark's package."""
    wildcards: dict[str, str] = field(default_factory=dict)
    """Wildcard name -> constraint (a regex) of the wildcards its rules add to the shared
    ones of workflow/rules/common.smk."""
    config_schema: str | None = None
    """A YAML file holding the JSON Schema of its config section, merged into the config
    schema under :attr:`name` (stereolens.config.config_schema), so the section validates
    with its defaults filled; None: the section is in config.schema.yaml itself."""
    cli: str | None = None
    """A module (a dotted name) whose ``register(subparsers)`` adds its `stereolens`
    subcommands; None: it has none."""
    model_rules: tuple[str, ...] = ()
    """Its rules whose jobs ask a model (besides the shared generate_images): what
    `stereolens regenerate --model/--benchmark` forces."""
    layout: Layout | None = None
    """Its output paths (stereolens.layout); None: a benchmark with no model job of its
    own."""
    presets: str | None = None
    """A folder of named presets (``paper.yaml``, ``released.yaml``): each lists the keys of
    the config section it sets (stereolens.settings); None: none."""
    planner: str | None = None
    """"module:function" of its planner world: ``function(config, priors, pilot, seed)``
    returns its designs (stereolens.design; `stereolens plan --power`); None: none."""
    priors: str | None = None
    """A YAML file holding its section of the planner's prior (stereolens.design.priors),
    used where the prior file has none for it; None: the prior file must have it."""
    power_check: str | None = None
    """"module:function" checking its planner world against its real pipeline:
    ``function(design, name, n, w, size)`` returns a stereolens.design.check.CheckResult
    (stereolens.design.check.check); None: none."""
    rounds: Rounds | None = None
    """How it runs in rounds under ``design.mode: adaptive`` (:class:`Rounds`); None: it
    runs its fixed design in either mode."""
    reader_design: str | None = None
    """"module:function" of its human sample for the reader correction: ``function(config,
    pilot)`` returns the human labels a target width needs, per model (stereolens.plan
    .reader_plan; `stereolens plan`); None: none."""

    def __post_init__(self) -> None:
        if self.report_tables is None:
            object.__setattr__(self, "report_tables", lambda config: dict(self.report_paths))

    @classmethod
    def from_functions(cls, namespace: dict[str, Any], **fields: Any) -> Benchmark:
        """The plug-in whose callables are the functions of ``namespace`` (a module's
        ``globals()``) named after the fields with a leading underscore: ``_enabled``,
        ``_check``, ``_jobs``, ``_targets``, ``_models`` and, where defined,
        ``_report_tables`` and ``_size``; ``fields`` gives the rest."""
        hooks = {f: namespace[f"_{f}"] for f in HOOKS if f"_{f}" in namespace}
        return cls(**hooks, **fields)


HOOKS = ("enabled", "check", "jobs", "targets", "models", "report_tables", "size")
"""The callable fields :meth:`Benchmark.from_functions` takes from a module by name."""


@lru_cache(maxsize=1)
def plugins() -> dict[str, str]:
    """Benchmark name -> "module:attribute" of its plug-in: the built-ins in order, then the
    other ``stereolens.benchmarks`` entry points by name; read once per process."""
    table = dict(BUILT_IN)
    found = {}
    # every entry point, also where two distributions declare one name (stereolens's own
    # built-ins are entry points of the group too: a clash must not hide behind them)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILT_IN and ep.value != BUILT_IN[ep.name]:
            raise ValueError(
                f"entry point {ENTRY_POINT_GROUP}:{ep.name} = {ep.value} claims the name of a "
                f"built-in benchmark ({BUILT_IN[ep.name]}): give the benchmark another name"
            )
        found[ep.name] = ep.value
    for name in sorted(found):
        table[name] = found[name]
    return table


def _load(name: str, target: str) -> Benchmark:
    module, _, attr = target.partition(":")
    plugin = getattr(importlib.import_module(module), attr)
    if not isinstance(plugin, Benchmark) or plugin.name != name:
        raise ValueError(
            f"benchmark {name!r} ({target}): expected a stereolens.benchmark.Benchmark named "
            f"{name!r}, got {plugin!r:.80}"
        )
    return plugin


def benchmarks(config: dict | None = None) -> list[Benchmark]:
    """The registered plug-ins in table order; with ``config``, only those it enables."""
    out = []
    for name, target in plugins().items():
        plugin = _load(name, target)
        if config is None or plugin.enabled(config):
            out.append(plugin)
    return out


def benchmark(name: str) -> Benchmark:
    """One plug-in by name; an unknown name says which exist."""
    table = plugins()
    if name not in table:
        raise ValueError(f"unknown benchmark {name!r}; registered: {', '.join(table)}")
    return _load(name, table[name])


def rules_files() -> list[str]:
    """The rules files of every registered benchmark, in table order (the Snakefile's includes)."""
    return [path for plugin in benchmarks() for path in plugin.rules]


def wildcard_patterns() -> dict[str, str]:
    """Wildcard -> constraint over every registered benchmark; a wildcard two benchmarks
    constrain differently is an error (Snakemake's constraints are global)."""
    out: dict[str, str] = {}
    owner: dict[str, str] = {}
    for plugin in benchmarks():
        for name, regex in plugin.wildcards.items():
            if name in out and out[name] != regex:
                raise ValueError(
                    f"wildcard {name!r} of benchmark {plugin.name!r} ({regex!r}) is constrained "
                    f"otherwise by benchmark {owner[name]!r} ({out[name]!r}): rename it"
                )
            out[name], owner[name] = regex, plugin.name
    return out


def model_rules() -> tuple[str, ...]:
    """Every rule whose jobs ask a model: generate_images and each benchmark's own."""
    out = ["generate_images"]
    for plugin in benchmarks():
        out += [r for r in plugin.model_rules if r not in out]
    return tuple(out)


def resolve(target: str) -> Callable:
    """The function a "module:function" string names."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def configured_models(config: dict) -> dict[str, list[str]]:
    """Benchmark -> the registry names its config uses (config order, each once), if enabled."""
    out = {}
    for plugin in benchmarks(config):
        names: list[str] = []
        for role_names in plugin.models(config).values():
            names += [n for n in role_names if n not in names]
        if names:
            out[plugin.name] = names
    return out


def all_targets(config: dict) -> list[str]:
    """The final outputs of every benchmark the config enables, in table order, each once."""
    out: list[str] = []
    for plugin in benchmarks(config):
        out += [t for t in plugin.targets(config) if t not in out]
    return out


def generating(config: dict | None = None) -> list[Benchmark]:
    """The plug-ins whose benchmarks generate images (rule generate_images runs for them)."""
    return [p for p in benchmarks(config) if p.generation_items]


def model_roles(config: dict) -> list[tuple[str, str]]:
    """(role, registry name) of every model the config runs, over the benchmarks it
    enables, in table order and each plug-in's role order (the report's Models table)."""
    return [
        (role, name)
        for plugin in benchmarks(config)
        for role, names in plugin.models(config).items()
        for name in names
    ]


def all_report_tables(config: dict) -> dict[str, str]:
    """Table name -> path over the enabled benchmarks; a name two of them claim is an error."""
    out: dict[str, str] = {}
    owner: dict[str, str] = {}
    for plugin in benchmarks(config):
        for name, path in plugin.report_tables(config).items():
            if name in out:
                raise ValueError(
                    f"report table {name!r} of benchmark {plugin.name!r} is already "
                    f"benchmark {owner[name]!r}'s: give it a name of its own"
                )
            out[name], owner[name] = path, plugin.name
    return out
