"""contextbias.invariant: the share of context-invariant (role, label) pairs and its
interval over roles, pinned on a fixed table computed by hand."""

import polars as pl
import pytest

from stereolens.contextbias.invariant import interval_min_roles, invariant_share
from stereolens.report.cli import report_config


def _ccs(flags: dict[str, list[bool | None]], model: str = "m") -> pl.DataFrame:
    roles = [r for r, f in flags.items() for _ in f]
    return pl.DataFrame(
        {"model": [model] * len(roles), "role": roles,
         "consistent": [x for f in flags.values() for x in f]},
        schema={"model": pl.String, "role": pl.String, "consistent": pl.Boolean},
    )  # fmt: skip


FOUR = {
    "A": [True, True, False],
    "B": [False, False],
    "C": [True, None],  # the null pair is left out: k 1 of n 1
    "D": [True, False, False, False],
}


def test_share_and_design_effect_interval_by_hand():
    # k = 2, 0, 1, 1 of n = 3, 2, 1, 4: K 4 of N 10, p = 0.4. Residuals k - p n = 0.8, -0.8,
    # 0.6, -0.6; cluster variance 4/3 x 2.0 / 10^2 = 0.026667, binomial 0.24 / 10 = 0.024:
    # deff = 10/9. Wilson on 3.6 of 9 (z = 1.959964): centre (0.4 + z^2/18) / (1 + z^2/9) =
    # 0.429913, half z sqrt(0.24/9 + z^2/324) / (1 + z^2/9) = 0.269612 -> [16.030, 69.953] %
    row = invariant_share(_ccs(FOUR), min_roles=3).row(0, named=True)
    assert (row["k"], row["n"], row["roles"]) == (4, 10, 4)
    assert row["estimate"] == pytest.approx(40.0)
    assert row["design_effect"] == pytest.approx(10 / 9)
    assert row["ci_low"] == pytest.approx(16.030, abs=2e-3)
    assert row["ci_high"] == pytest.approx(69.953, abs=2e-3)
    assert row["interval_note"] is None


def test_homogeneous_roles_floor_the_design_effect_at_one():
    # every role 1 of 2: residuals 0, cluster variance 0 < binomial: deff 1 (the floor), the
    # plain Wilson on 4 of 8: centre 0.5, half z sqrt(0.25/8 + z^2/256) / (1 + z^2/8) =
    # 0.284786 -> [21.521, 78.479] %
    flags = {f"r{i}": [True, False] for i in range(4)}
    row = invariant_share(_ccs(flags), min_roles=3).row(0, named=True)
    assert row["design_effect"] == 1.0
    assert row["ci_low"] == pytest.approx(21.521, abs=2e-3)
    assert row["ci_high"] == pytest.approx(78.479, abs=2e-3)


def test_withheld_below_min_roles_per_model():
    t = pl.concat([_ccs(FOUR, "m1"), _ccs({"A": [True], "B": [False]}, "m2")])
    out = invariant_share(t, min_roles=3).sort("model")
    m1, m2 = out.row(0, named=True), out.row(1, named=True)
    assert m1["ci_low"] is not None and m1["interval_note"] is None
    assert m2["estimate"] == pytest.approx(50.0)
    assert m2["ci_low"] is None and m2["ci_high"] is None and m2["design_effect"] is None
    assert m2["interval_note"].startswith("withheld: 2 roles < 3")
    default = invariant_share(_ccs(FOUR)).row(0, named=True)
    assert default["ci_low"] is None and "4 roles < 10" in default["interval_note"]


def test_errors_and_config():
    with pytest.raises(ValueError, match="lacks column"):
        invariant_share(pl.DataFrame({"model": ["m"], "consistent": [True]}))
    assert interval_min_roles(report_config({})) == 10
    five = report_config({"contextbias": {"metrics": {"interval_min_roles": 5}}})
    assert interval_min_roles(five) == 5
    with pytest.raises(ValueError, match="interval_min_roles"):
        interval_min_roles(report_config({"contextbias": {"metrics": {"interval_min_roles": 1}}}))
