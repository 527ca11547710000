"""Bias Intensity (ContextBias Eq. 1) pinned with hand-computed values."""

import math

import polars as pl
import pytest

from stereolens.contextbias.metrics import pooled_bi
from stereolens.metrics.entropy import bias_intensity


def test_bias_intensity_hand_values():
    # p = (.5, .25, .25): H = 1.5 ln 2; K = 4: log K = 2 ln 2 -> BI = 1 - 0.75
    assert bias_intensity([2, 1, 1], k=4) == pytest.approx(0.25, abs=1e-12)
    # K = 3 (labels in the cell): H / ln 3 = 1.0397208 / 1.0986123
    assert bias_intensity([2, 1, 1]) == pytest.approx(1 - 1.0397208 / 1.0986123, abs=1e-7)
    # p = (.75, .25): H = .75 ln(4/3) + .25 ln 4 = 0.5623351; / ln 2
    assert bias_intensity([3, 1]) == pytest.approx(1 - 0.5623351 / math.log(2), abs=1e-7)
    assert bias_intensity([4, 4]) == pytest.approx(0.0, abs=1e-12)  # uniform
    assert bias_intensity([7], k=1) == 1.0  # one label: fully concentrated
    assert bias_intensity([7], k=3) == 1.0  # H = 0
    assert math.isnan(bias_intensity([0, 0]))
    with pytest.raises(ValueError, match="smaller"):
        bias_intensity([1, 1, 1], k=2)


def _rows(model, condition, image, dims):
    return [
        {
            "model": model,
            "role": r,
            "condition": condition,
            "image_id": f"{model}{condition}{image}",
            "cohort": "people",
            "dimension": d,
            "label": lab,
        }
        for r, d, lab in dims
    ]


@pytest.fixture
def table():
    rows = []
    # CF: gender female x2, male x1 (3 images);
    # K(model) = 3: female, male, and nonbinary (seen in CA-U)
    rows += _rows("m", "CF", 1, [("nurse", "gender_presentation", "female")])
    rows += _rows("m", "CF", 2, [("nurse", "gender_presentation", "female")])
    rows += _rows("m", "CF", 3, [("carpenter", "gender_presentation", "male")])
    # CA-U: one of each label; one image also has a pose
    rows += _rows(
        "m", "CA-U", 1, [("nurse", "gender_presentation", "female"), ("nurse", "pose", "standing")]
    )
    rows += _rows("m", "CA-U", 2, [("carpenter", "gender_presentation", "male")])
    rows += _rows("m", "CA-U", 3, [("carpenter", "gender_presentation", "nonbinary")])
    return pl.DataFrame(rows)


def test_pooled_bi_k_definitions(table):
    h = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    bi = pooled_bi(table, k_definition="model")
    cf = bi.filter((pl.col("dimension") == "gender_presentation") & (pl.col("condition") == "CF"))
    assert cf["k"].item() == 3
    assert cf["bi"].item() == pytest.approx(1 - h / math.log(3))
    assert cf["n_images"].item() == 3
    assert set(bi["aggregation"]) == {"pooled"}
    cau = bi.filter(
        (pl.col("dimension") == "gender_presentation") & (pl.col("condition") == "CA-U")
    )
    assert cau["bi"].item() == pytest.approx(0.0, abs=1e-12)  # uniform over K = 3
    cell = pooled_bi(table, k_definition="cell")
    cf = cell.filter((pl.col("dimension") == "gender_presentation") & (pl.col("condition") == "CF"))
    assert cf["k"].item() == 2 and cf["bi"].item() == pytest.approx(1 - h / math.log(2))
    vocab = pooled_bi(table, k_definition="vocabulary")  # schema: female, male, nonbinary
    cf = vocab.filter(
        (pl.col("dimension") == "gender_presentation") & (pl.col("condition") == "CF")
    )
    assert cf["k"].item() == 3
    assert set(vocab["k_definition"]) == {"vocabulary"}


def test_cohort_rows_are_the_mean_of_dimensions(table):
    bi = pooled_bi(table)
    cau = bi.filter(pl.col("condition") == "CA-U")
    dims = cau.filter(pl.col("dimension") != "*")
    # pose: one label seen -> K = 1 -> BI 1.0; gender: 0.0 -> cohort mean 0.5
    assert dims.filter(pl.col("dimension") == "pose")["bi"].item() == 1.0
    cohort = cau.filter((pl.col("cohort") == "people") & (pl.col("dimension") == "*"))
    assert cohort["bi"].item() == pytest.approx(0.5)
    overall = cau.filter((pl.col("cohort") == "*") & (pl.col("dimension") == "*"))
    assert overall["bi"].item() == pytest.approx(0.5)
    assert list(bi.columns) == [
        "model",
        "cohort",
        "dimension",
        "condition",
        "aggregation",
        "bi",
        "n_images",
        "k",
        "k_definition",
    ]


def test_images_table_sets_the_denominator(table):
    images = pl.DataFrame(
        {
            "model": ["m"] * 5,
            "condition": ["CF"] * 5,
            "image_id": [f"mCF{i}" for i in range(1, 6)],
            "status": ["ok", "ok", "ok", "ok", "discarded"],
        }
    )
    bi = pooled_bi(table, images)
    cf = bi.filter((pl.col("dimension") == "gender_presentation") & (pl.col("condition") == "CF"))
    assert cf["n_images"].item() == 4  # the 4th ok image has no label; discarded not counted


def test_extractor_column_splits_results(table):
    both = pl.concat(
        [
            table.with_columns(pl.lit("a").alias("extractor")),
            table.with_columns(pl.lit("b").alias("extractor")),
        ]
    )
    bi = pooled_bi(both)
    assert bi.columns[0] == "extractor"
    assert bi.height == 2 * pooled_bi(table).height


def test_bad_tables_are_rejected(table):
    with pytest.raises(ValueError, match="lacks columns"):
        pooled_bi(table.drop("cohort"))
    bad = pl.concat([table, table.head(1).with_columns(pl.lit("unknown").alias("label"))])
    with pytest.raises(ValueError, match="unknown"):
        pooled_bi(bad)
    with pytest.raises(ValueError, match="k_definition"):
        pooled_bi(table, k_definition="bogus")
