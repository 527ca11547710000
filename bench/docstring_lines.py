"""Module-docstring lines per module under src/stereolens (issue 22, item 5: one to three lines).

Usage: python bench/docstring_lines.py [--over 3] [--list]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def docstring_lines(root: Path) -> dict[str, int]:
    """Lines of each module's docstring (ast.get_docstring), by path relative to root."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        out[str(path.relative_to(root))] = len(doc.splitlines()) if doc else 0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--over", type=int, default=3, help="count and list modules above this")
    ap.add_argument("--list", action="store_true", help="list the modules above --over")
    args = ap.parse_args()
    lines = docstring_lines(ROOT / "src" / "stereolens")
    over = {k: v for k, v in lines.items() if v > args.over}
    if args.list:
        for name, n in sorted(over.items(), key=lambda kv: -kv[1]):
            print(f"{n:4d}  {name}")
    print(
        f"modules {len(lines)}, docstring lines {sum(lines.values())}, "
        f"multi-line {sum(v > 1 for v in lines.values())}, over {args.over}: {len(over)}, "
        f"max {max(lines.values())}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
