"""`stereolens mybench score`: MyBench's subcommand (its plug-in names this module)."""

import argparse


def _score(args: argparse.Namespace) -> int:
    from mybench.jobs import scores
    from stereolens.tables import write_table

    write_table(args.out, scores(args.answers))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `stereolens mybench` to the CLI's subcommands."""
    b = sub.add_parser("mybench", help="MyBench tools")
    b_sub = b.add_subparsers(dest="mybench_command", required=True)
    s = b_sub.add_parser("score", help="the scores table from the answer files")
    s.add_argument("answers", nargs="+", metavar="ANSWERS", help="answers.jsonl of each model")
    s.add_argument("--out", required=True, metavar="FILE", help="scores.parquet")
    s.set_defaults(func=_score)
