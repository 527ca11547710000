"""Report helpers: the debiasing-variant comparison."""

import polars as pl
import pytest

from stereolens.report import _variant_deltas


def test_variant_deltas_are_variant_minus_base():
    def imp(variant, g, r):
        return [
            {
                "variant": variant,
                "model": "m",
                "level": "model",
                "protected_attribute": a,
                "score": v,
            }
            for a, v in (("gender", g), ("race", r))
        ]

    implicit = pl.DataFrame(imp("m", 0.80, 0.70) + imp("m-fair", 0.90, 0.65))
    explicit = pl.DataFrame(
        [
            {
                "variant": v,
                "model": "m",
                "level": "model",
                "protected_attribute": "gender",
                "protected_value": "*",
                "score": s,
            }
            for v, s in (("m", 0.5), ("m-fair", 0.6))
        ]
    )
    eta = pl.DataFrame(
        [
            {
                "variant": v,
                "model": "m",
                "pair": "*",
                "eta_total": t,
                "eta_gender": t,
                "eta_race": 0.5,
                "eta_age": 0.5,
            }
            for v, t in (("m", 0.6), ("m-fair", 0.55))
        ]
    )
    d = _variant_deltas(implicit, explicit, eta)
    assert set(d["variant"]) == {"m-fair"}
    change = {(r["metric"], r["protected_attribute"]): r["change"] for r in d.iter_rows(named=True)}
    assert change[("S_imp", "gender")] == pytest.approx(0.10)
    assert change[("S_imp", "race")] == pytest.approx(-0.05)  # a side effect on race
    assert change[("S_exp", "gender")] == pytest.approx(0.10)
    assert change[("eta", "*")] == pytest.approx(-0.05)
    assert change[("eta", "race")] == pytest.approx(0.0)
