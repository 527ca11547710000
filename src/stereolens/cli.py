"""The `stereolens` command line. Each benchmark registers its own subcommands (the module
its plug-in names in ``cli``); a subcommand imports only what it needs when it runs."""

from __future__ import annotations

import argparse
import importlib
import sys

from stereolens import __version__
from stereolens import check_models as check_models_cli
from stereolens import plan as plan_cli
from stereolens import regenerate as regenerate_cli
from stereolens.report import cli as report_cli


def _build_tiny(args: argparse.Namespace) -> int:
    if args.builder == "tiny-diffusion":
        from stereolens.models.tiny.diffusion import build_tiny_diffusion as build
    elif args.builder == "tiny-vlm-vllm":
        from stereolens.models.tiny.vlm import build_tiny_vllm_vlm as build
    else:
        from stereolens.models.tiny.vlm import build_tiny_vlm as build
    path = build(args.out)  # seed 0: the checkpoints every run and test shares
    print(f"built {args.builder} checkpoint in {path}")
    return 0


def _check_config(args: argparse.Namespace) -> int:
    from stereolens.benchmark import benchmarks
    from stereolens.config import check_model_sources, load_config
    from stereolens.design import rounds
    from stereolens.plan import check_ceiling, default_throughput

    config, registry = load_config(args.configfile)
    check_model_sources(config, registry)
    at = rounds.check(config, registry, default_throughput())  # the workflow's own check
    got = check_ceiling(config, registry, default_throughput(), at)
    parts = []
    for plugin in benchmarks(config):
        models = sorted({m for names in plugin.models(config).values() for m in names})
        parts.append(f"{plugin.title}: {len(plugin.jobs(config))} model jobs, {', '.join(models)}")
    lim = config["limits"]
    print(
        f"{args.configfile}: valid. Registry {config['registry']} ({len(registry)} models). "
        + "; ".join(parts)
        + f". Size{' at the GPU-hours cap' if got['capped'] else ''}: {got['jobs']:,} model "
        f"jobs, {got['images']:,} images, "
        f"{got['gpu_hours']:,.1f} GPU-hours (limits {lim['max_jobs']:,}, "
        f"{lim['max_images']:,}, {lim['max_gpu_hours']:,})"
    )
    if rounds.adaptive(config):
        split = [f"{p.title} in rounds at {rounds.sizes(config, p, at)} shards per cell"
                 for p in rounds.in_rounds(config)]  # fmt: skip
        fixed = [p.title for p in benchmarks(config) if p.rounds is None]
        print("Adaptive design: " + "; ".join(split + [f"{t} fixed (no rounds)" for t in fixed]))
        if at is not None and at.cap is not None:
            titles = {p.name: p.title for p in rounds.in_rounds(config)}
            print(rounds.describe_budget(at, titles))
    from stereolens.check_models import configured_models
    from stereolens.models.api_wait import api_wait_lines

    for line in api_wait_lines(registry, configured_models(config)):
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stereolens", description="Social-bias audits of generative vision models."
    )
    parser.add_argument("--version", action="version", version=f"stereolens {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from stereolens.benchmark import benchmarks

    for plugin in benchmarks():
        if plugin.cli:
            importlib.import_module(plugin.cli).register(sub)
    plan_cli.register(sub)
    regenerate_cli.register(sub)
    report_cli.register(sub)

    c = sub.add_parser(
        "check-config",
        help="check a run config the way the workflow does at parse time",
        description=(
            "Read a config and check it as the Snakefile does before any job is queued: "
            "YAML syntax (file, line and column; Snakemake itself only says 'not valid JSON "
            "or YAML'), the config schema, the registry, the models it names and the prompt "
            "bank (roles, conditions, prompts, role names), the run's size against its "
            "ceilings (limits: jobs, images, GPU-hours), and the models it uses: a local "
            "model: path that is missing or holds no model, an api_key_env variable unset."
        ),
    )
    c.add_argument("--configfile", required=True, metavar="FILE")
    c.set_defaults(func=_check_config)
    check_models_cli.register(sub)

    t = sub.add_parser(
        "build-tiny", help="build a tiny random-weight checkpoint (embedded default)"
    )
    t.add_argument(
        "--builder", required=True, choices=["tiny-diffusion", "tiny-vlm", "tiny-vlm-vllm"]
    )
    t.add_argument("--out", required=True, metavar="DIR")
    t.set_defaults(func=_build_tiny)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"stereolens: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
