"""`stereolens report --results DIR --out FILE`: the report of any results folder, its tables
found at their standard paths; without ``--configfile`` models and benchmarks come from them."""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path


def infer_config(inputs) -> dict:
    """A config naming what the tables hold, for a report without the run's config: each
    benchmark's section from its report module's ``infer_config``."""
    from stereolens.report.render import benchmark_modules

    config: dict = {"run_label": "results folder"}
    for module in benchmark_modules():
        infer = getattr(module, "infer_config", None)
        config[module.KEY] = infer(inputs) if infer else {}
    return config


def report_config(sections: dict) -> dict:
    """``sections`` over each report module's ``NOT_SHOWN`` keys, validated with defaults."""
    from stereolens.config import validate_report_config
    from stereolens.report.render import benchmark_modules

    config = copy.deepcopy(sections)
    for module in benchmark_modules():
        unknown = copy.deepcopy(getattr(module, "NOT_SHOWN", {}))
        config[module.KEY] = {**unknown, **config.get(module.KEY, {})}
    return validate_report_config(config)


def always_written() -> dict:
    """A validated config with every optional part of each benchmark off (each report
    module's ``ALWAYS_WRITTEN``): its report_tables are those every run writes."""
    from stereolens.report.render import benchmark_modules

    return report_config({m.KEY: getattr(m, "ALWAYS_WRITTEN", {}) for m in benchmark_modules()})


def expected_tables(inputs, config: dict | None) -> dict[str, str]:
    """name -> path of every table the report expects (the config's, else always_written's)."""
    from stereolens.benchmark import all_report_tables, benchmarks
    from stereolens.report.inputs import RESULTS

    if config is not None:
        tables = all_report_tables(config)
    else:
        tables = {}
        minimal = always_written()
        for plugin in benchmarks():
            if any(inputs.has(name) for name in plugin.report_paths):
                tables |= plugin.report_tables(minimal)
    return {k: v.removeprefix(RESULTS) for k, v in tables.items()}


def check_tables(inputs, results: Path, config: dict | None) -> list[str]:
    """Refuse (DamagedTable, naming each file and the command that mends it) when a table
    there is damaged; return the expected tables that are missing, as "name (path)"."""
    from stereolens.damage import require_intact

    require_intact(inputs.paths.values())
    return [
        f"{name} ({results / rel})"
        for name, rel in expected_tables(inputs, config).items()
        if not inputs.has(name)
    ]


def _run(args: argparse.Namespace) -> int:
    from stereolens.report.inputs import Inputs, standard_paths
    from stereolens.report.render import benchmark_modules, render_report

    results = Path(args.results)
    extra = {"registry": args.registry, "throughput_table": args.throughput}
    config = None
    if args.configfile:
        from stereolens.config import load_config

        config, _ = load_config(args.configfile)
        extra["registry"] = extra["registry"] or config["registry"]
    inputs = Inputs.from_results(results, extra)
    # each report module's HEADLINE: the table that says its benchmark has results there
    headlines = [m.HEADLINE for m in benchmark_modules() if getattr(m, "HEADLINE", None)]
    if not any(inputs.has(k) for k in headlines):
        paths = [str(results / standard_paths()[k]) for k in headlines]
        raise ValueError(
            f"no result tables under {results}: expected e.g. "
            f"{', '.join(paths[:-1])} or {paths[-1]}"
        )
    missing = check_tables(inputs, results, config)
    if missing:
        print(
            f"stereolens report: WARNING: {len(missing)} table(s) the report expects are "
            f"missing, and the sections and galleries made from them are left out: "
            f"{', '.join(missing)}. A run that lost them (a failed job deletes its outputs): "
            "mend it with `stereolens regenerate --shard <that path> --configfile <config>`.",
            file=sys.stderr,
        )
    shown = None
    if config is None:
        shown = infer_config(inputs)
        if args.registry:
            shown["registry"] = args.registry
        config = report_config(shown)
    elif args.registry:
        config["registry"] = args.registry
    cache = Path(args.cache_dir) if args.cache_dir else None
    got = render_report(
        config,
        inputs,
        args.out,
        cache_dir=cache,
        threads=args.threads,
        galleries=not args.no_galleries,
        shown_config=shown,
    )
    if args.screenshot:
        from stereolens.report.browser import screenshot

        got["screenshot"] = str(screenshot(Path(args.out)))
    got["index"] = str(got["index"])
    got["missing_tables"] = missing
    print(json.dumps(got, default=str))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `stereolens report` to the CLI's subcommands."""
    p = sub.add_parser(
        "report",
        help="render the HTML report of a results folder",
        description=(
            "Render index.html (with figures/, tables/ and galleries/ beside it) from the "
            "tables of a results folder at their standard paths (contextbias/metrics/bi.parquet, "
            "biasig/metrics/eta.parquet, lvlm/metrics/scores.parquet, ...). Relative image "
            "paths in the tables are resolved against the current directory and the folder "
            "that holds DIR."
        ),
    )
    p.add_argument("--results", required=True, metavar="DIR", help="a results folder")
    p.add_argument("--out", required=True, metavar="FILE", help="the report's index.html")
    p.add_argument("--configfile", metavar="FILE", help="the run's config (optional)")
    p.add_argument("--registry", metavar="FILE", help="the model registry (Models table)")
    p.add_argument(
        "--throughput",
        metavar="FILE",
        help="the planner's throughput table (config/throughput.yaml)",
    )
    p.add_argument("--cache-dir", metavar="DIR", help="keep gallery thumbnails here between runs")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--no-galleries", action="store_true", help="leave the galleries out")
    p.add_argument(
        "--screenshot",
        action="store_true",
        help="also write a PNG of the first screen next to the report (headless Chromium)",
    )
    p.set_defaults(func=_run)
