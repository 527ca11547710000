"""The ``interval_note`` of a design below its benchmark's minimum size: the one
wording of every benchmark's note, each benchmark passing its unit and the reason for its
minimum."""

from __future__ import annotations


def withheld_note(n: float, minimum: int, unit: str, why: str) -> str | None:
    """None when ``n`` (in ``unit``) is at least ``minimum``; else "withheld: <n> <unit> <
    <minimum> (<why>, bench/COVERAGE.md)"."""
    if n >= minimum:
        return None
    count = str(int(n)) if float(n).is_integer() else f"{n:g}"
    return f"withheld: {count} {unit} < {minimum} ({why}, bench/COVERAGE.md)"
