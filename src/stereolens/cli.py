"""The `stereolens` command line. Each benchmark registers its own subcommands;
a subcommand imports only what it needs when it runs."""

from __future__ import annotations

import argparse
import sys

from stereolens import __version__
from stereolens import check_models as check_models_cli
from stereolens import plan as plan_cli
from stereolens.biasig import cli as biasig_cli
from stereolens.contextbias import cli as contextbias_cli
from stereolens.lvlm import cli as lvlm_cli


def _build_tiny(args: argparse.Namespace) -> int:
    if args.builder == "tiny-diffusion":
        from stereolens.tiny.diffusion import build_tiny_diffusion as build
    else:
        from stereolens.tiny.vlm import build_tiny_vlm as build
    path = build(args.out, seed=args.seed)
    print(f"built {args.builder} checkpoint in {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stereolens", description="Social-bias audits of generative vision models."
    )
    parser.add_argument("--version", action="version", version=f"stereolens {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    contextbias_cli.register(sub)
    biasig_cli.register(sub)
    lvlm_cli.register(sub)
    plan_cli.register(sub)
    check_models_cli.register(sub)

    t = sub.add_parser(
        "build-tiny", help="build a tiny random-weight checkpoint (embedded default)"
    )
    t.add_argument("--builder", required=True, choices=["tiny-diffusion", "tiny-vlm"])
    t.add_argument("--out", required=True, metavar="DIR")
    t.add_argument("--seed", type=int, default=0)
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
