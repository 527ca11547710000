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
    # one possible label (K = 1, 0/0): 0.0 as the released code (default), or 1.0
    assert bias_intensity([7], k=1) == 0.0
    assert bias_intensity([7], k=1, single_label_bi=1.0) == 1.0
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
    # pose: one label seen -> K = 1 -> BI 0.0 (released default); gender: 0.0 -> mean 0.0
    assert dims.filter(pl.col("dimension") == "pose")["bi"].item() == 0.0
    cohort = cau.filter((pl.col("cohort") == "people") & (pl.col("dimension") == "*"))
    assert cohort["bi"].item() == pytest.approx(0.0)
    one = pooled_bi(table, single_label_bi=1.0).filter(pl.col("condition") == "CA-U")
    assert one.filter(pl.col("dimension") == "pose")["bi"].item() == 1.0
    cohort = one.filter((pl.col("cohort") == "people") & (pl.col("dimension") == "*"))
    assert cohort["bi"].item() == pytest.approx(0.5)
    overall = one.filter((pl.col("cohort") == "*") & (pl.col("dimension") == "*"))
    assert overall["bi"].item() == pytest.approx(0.5)  # one cohort: both definitions agree
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
        "overall_definition",
    ]
    with pytest.raises(ValueError, match="single_label_bi"):
        pooled_bi(table, single_label_bi=0.5)


def _cohort_table(values: dict[str, list[list[str]]]) -> pl.DataFrame:
    """One role, condition CF; per cohort a list of dimensions, each a list of labels, one
    image per label (so each dimension's counts are its labels' multiplicities)."""
    rows = []
    for cohort, dims in values.items():
        for d, labels in enumerate(dims):
            for i, lab in enumerate(labels):
                rows.append(
                    {
                        "model": "m",
                        "role": "r",
                        "condition": "CF",
                        "image_id": f"i{i}",
                        "cohort": cohort,
                        "dimension": f"{cohort}_{d}",
                        "label": lab,
                    }
                )
    return pl.DataFrame(rows)


def test_overall_is_the_mean_of_cohorts_on_two_cohorts_of_unequal_size():
    # people: three dimensions, one with counts 3:1 (BI 1 - H/log 2 = 0.1887219) and two
    # uniform (BI 0); objects: one dimension with counts 1:3 (BI 0.1887219)
    h31 = 0.75 * math.log(4 / 3) + 0.25 * math.log(4)
    bi31 = 1 - h31 / math.log(2)  # 0.1887219
    table = _cohort_table(
        {
            "people": [["a", "a", "a", "b"], ["a", "b"], ["a", "b"]],  # BI bi31, 0, 0
            "objects": [["x", "y", "y", "y"]],  # BI bi31
        }
    )
    bi = pooled_bi(table).filter(pl.col("dimension") == "*")
    people = bi.filter(pl.col("cohort") == "people")["bi"].item()
    objects = bi.filter(pl.col("cohort") == "objects")["bi"].item()
    assert people == pytest.approx(bi31 / 3)
    assert objects == pytest.approx(bi31)
    overall = bi.filter(pl.col("cohort") == "*")
    # mean of the two cohort means: (bi31/3 + bi31) / 2 = 2/3 bi31 = 0.1258146
    assert overall["bi"].item() == pytest.approx((bi31 / 3 + bi31) / 2)
    assert overall["overall_definition"].item() == "cohort"
    dim = pooled_bi(table, overall="dimension").filter(
        (pl.col("cohort") == "*") & (pl.col("dimension") == "*")
    )
    # mean of the four dimensions: 2 bi31 / 4 = 0.0943609
    assert dim["bi"].item() == pytest.approx(bi31 / 2)
    assert dim["overall_definition"].item() == "dimension"
    with pytest.raises(ValueError, match="overall"):
        pooled_bi(table, overall="bogus")


def test_overall_of_paper_table_10_cohort_values():
    # Paper Table 10 CF cohort values: People 0.457, Scene 0.430, Camera 0.668, Objects
    # 0.251; each cohort weighs the same: (0.457 + 0.430 + 0.668 + 0.251) / 4 = 0.4515.
    # The cohorts have 3, 1, 2 and 1 dimensions here, so the dimension mean differs:
    # (0.357 + 0.457 + 0.557 + 0.430 + 0.600 + 0.736 + 0.251) / 7 = 0.484
    from stereolens.contextbias.metrics import _with_summary_rows

    cohorts = ["people"] * 3 + ["scene"] + ["camera"] * 2 + ["objects"]
    dims = pl.DataFrame(
        {
            "model": ["m"] * 7,
            "cohort": cohorts,
            "dimension": [f"d{i}" for i in range(7)],
            "condition": ["CF"] * 7,
            "bi": [0.357, 0.457, 0.557, 0.430, 0.600, 0.736, 0.251],
            "n_images": [10] * 7,
            "k": [2] * 7,
        }
    )
    out = _with_summary_rows(dims, ["model"], "pooled", "model", "cohort")
    cohort_rows = out.filter((pl.col("dimension") == "*") & (pl.col("cohort") != "*"))
    assert dict(cohort_rows.select("cohort", "bi").iter_rows()) == pytest.approx(
        {"people": 0.457, "scene": 0.430, "camera": 0.668, "objects": 0.251}
    )
    overall = out.filter((pl.col("cohort") == "*") & (pl.col("dimension") == "*"))
    assert overall["bi"].item() == pytest.approx(0.4515, abs=1e-12)
    by_dim = _with_summary_rows(dims, ["model"], "pooled", "model", "dimension")
    overall = by_dim.filter((pl.col("cohort") == "*") & (pl.col("dimension") == "*"))
    assert overall["bi"].item() == pytest.approx(3.388 / 7, abs=1e-12)


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
