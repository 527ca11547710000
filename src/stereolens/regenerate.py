"""`stereolens regenerate`: redo chosen model jobs and everything downstream of them, by
``snakemake --forcerun`` on their outputs (docs/troubleshooting.md)."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from stereolens.damage import REGENERATING_ENV

LOCK_ADVICE = (
    "a Snakemake run holds the lock on this folder, or a killed one (kill -9, a lost node) "
    "left it: if no snakemake runs here, run `snakemake --unlock {config}` once, then this "
    "command again"
)


def summary_rows(text: str) -> list[tuple[str, str]]:
    """(output file, rule) of every line of ``snakemake --summary`` output."""
    rows = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[0] != "output_file":
            rows.append((parts[0], parts[2]))
    return rows


def select_outputs(
    rows: list[tuple[str, str]],
    *,
    shards: list[str] = (),
    models: list[str] = (),
    benchmarks: list[str] = (),
    rules: list[str] = (),
) -> list[str]:
    """The outputs to force: shards (exact paths), model-job outputs one of whose keys is a
    model's name (within the benchmarks when given), model-job outputs of whole benchmarks,
    or every output of the rules."""
    from stereolens.benchmark import benchmarks as registered
    from stereolens.benchmark import model_rules

    asks_model = model_rules()
    layouts = [p.layout for p in registered() if p.layout is not None]

    def owner(path: str) -> tuple[str | None, set[str]]:
        """The benchmark whose layout the path is of, and the path's keys."""
        for layout in layouts:
            parsed = layout.parse(Path(path).as_posix())
            if parsed is not None:
                return layout.benchmark, set(parsed.keys.values())
        return None, set()

    wanted = {str(Path(s)) for s in shards}
    out = []
    for path, rule in rows:
        bench, keys = owner(path) if rule in asks_model else (None, set())
        bench_ok = not benchmarks or bench in benchmarks
        if str(Path(path)) in wanted:
            out.append(path)
        elif rule in rules:
            out.append(path)
        elif rule in asks_model and models and bench_ok and any(m in keys for m in models):
            out.append(path)
        elif rule in asks_model and benchmarks and not models and bench_ok:
            out.append(path)
    unknown = wanted - {str(Path(p)) for p in out}
    if unknown:
        raise ValueError(
            f"not an output of this workflow and config: {', '.join(sorted(unknown))} "
            "(give the path as docs/outputs.md's Results table names it, e.g. "
            "results/contextbias/images/<model>/<role>/<condition>/<shard>)"
        )
    return out


def _snakemake(args: argparse.Namespace) -> list[str]:
    cmd = [args.snakemake]
    if args.profile:
        cmd += ["--profile", args.profile]
    if args.configfile:
        cmd += ["--configfile", args.configfile]
    return cmd


def _locked(directory: Path) -> bool:
    locks = directory / ".snakemake" / "locks"
    return locks.is_dir() and any(locks.iterdir())


def run(args: argparse.Namespace) -> int:
    selection = bool(args.shard or args.model or args.benchmark or args.rule)
    if args.all == selection:
        raise ValueError(
            "say what to regenerate: --shard PATH, --model NAME (optionally with "
            "--benchmark), --benchmark NAME, --rule NAME (each repeatable), or --all"
        )
    config = f"--configfile {args.configfile}" if args.configfile else ""
    if _locked(Path.cwd()) and not args.dry_run:
        print(f"stereolens: error: {LOCK_ADVICE.format(config=config)}", file=sys.stderr)
        return 2
    base = _snakemake(args)
    # the workflow's parse refuses a run while a table is damaged; a regeneration is how
    # one is mended, so its runs only warn (stereolens.damage)
    env = {**os.environ, REGENERATING_ENV: "1"}
    if args.all:
        forced = ["--forceall"]
    else:
        summary = subprocess.run(
            [*base, "--summary", "--quiet"], capture_output=True, text=True, check=False, env=env
        )
        if summary.returncode != 0:
            print(summary.stdout[-2000:] + summary.stderr[-4000:], file=sys.stderr)
            return summary.returncode
        outputs = select_outputs(
            summary_rows(summary.stdout),
            shards=args.shard,
            models=args.model,
            benchmarks=args.benchmark,
            rules=args.rule,
        )
        if not outputs:
            raise ValueError("the selection names no model job of this workflow and config")
        forced = ["--forcerun", *outputs]
        print(f"regenerating {len(outputs)} output(s) and everything made from them")
    extra = [a for a in args.snakemake_args if a != "--"][: len(args.snakemake_args)]
    cmd = [*base, *forced, *(["--dry-run"] if args.dry_run else []), *extra]
    shown = " ".join(shlex.quote(c) for c in cmd)
    print(shown if len(shown) < 2000 else shown[:2000] + " ...")
    return subprocess.run(cmd, check=False, env=env).returncode


def register(sub: argparse._SubParsersAction) -> None:
    from stereolens.benchmark import benchmarks

    p = sub.add_parser(
        "regenerate",
        help="redo chosen model jobs (a shard, a model, a benchmark, everything) and all "
        "that depends on them",
        description=(
            "Regenerate part of a run: Snakemake does not rebuild a deleted intermediate "
            "while the tables made from it exist, so this runs `snakemake --forcerun` on "
            "the outputs of the chosen model jobs (found with `snakemake --summary`), which "
            "reruns them and everything downstream. Run it where you run snakemake, with "
            "the same --configfile and --profile. Arguments after `--` go to snakemake."
        ),
    )
    p.add_argument("--configfile", metavar="FILE", help="the run's config (as for snakemake)")
    p.add_argument("--profile", metavar="DIR", help="the Snakemake profile (e.g. profiles/slurm)")
    p.add_argument(
        "--shard",
        action="append",
        default=[],
        metavar="PATH",
        help="one job's output, e.g. results/contextbias/images/sdxl/nurse/CF/0 or "
        "results/contextbias/extractions/gpt-5-mini/sdxl/nurse/CF/0.jsonl",
    )
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="every model job whose output path names this registry model (generator, "
        "extractor, VQA model or audited LVLM)",
    )
    p.add_argument(
        "--benchmark",
        action="append",
        default=[],
        choices=[plugin.name for plugin in benchmarks()],
        help="every model job of the benchmark (with --model: that model's, there only)",
    )
    p.add_argument(
        "--rule", action="append", default=[], metavar="RULE", help="every job of a rule"
    )
    p.add_argument("--all", action="store_true", help="everything (snakemake --forceall)")
    p.add_argument("--dry-run", "-n", action="store_true", help="show what would run")
    p.add_argument("--snakemake", default="snakemake", help=argparse.SUPPRESS)
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=run)
