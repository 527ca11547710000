"""Metrics CLIs refuse inputs that would change the numbers, in one line naming the table,
the column, the rows and what to do (the issue's reproductions, one by one)."""

import polars as pl
import pytest

from stereolens.cli import main
from stereolens.tables import ATTRIBUTES, RESPONSES, check_table
from stereolens.validation import ConfigError


def _attributes(n_roles=2):
    rows = []
    for role in [f"r{i}" for i in range(n_roles)]:
        for cond in ("CF", "CA-R", "CA-U"):
            for i in range(4):
                rows.append(
                    {
                        "model": "m",
                        "role": role,
                        "condition": cond,
                        "image_id": f"{role}{cond}{i}",
                        "cohort": "people",
                        "dimension": "gender_presentation",
                        "label": "female" if i % 2 else "male",
                    }
                )
    return pl.DataFrame(rows)


def _run(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def _cb(tmp_path, frame, capsys, images=None):
    path = tmp_path / "attributes.parquet"
    frame.write_parquet(path)
    argv = ["contextbias", "metrics", "--attributes", str(path), "--out", str(tmp_path / "out")]
    argv += ["--preset", '{"metrics": {"replicates": 5, "matched_draws": 1}}']
    if images is not None:
        images.write_parquet(tmp_path / "images.parquet")
        argv += ["--images", str(tmp_path / "images.parquet")]
    return _run(argv, capsys)


def test_contextbias_metrics_refuse_duplicated_attribute_rows(tmp_path, capsys):
    good = _attributes()
    assert _cb(tmp_path, good, capsys)[0] == 0
    # three duplicated rows used to change 40 BI values silently
    code, err = _cb(tmp_path, pl.concat([good, good.head(3)]), capsys)
    assert code == 2 and "attributes table" in err and "repeat the key" in err
    assert "rows [0, 1, 2" in err and "drop the duplicates" in err
    assert len(err.strip().splitlines()) == 1
    # a fully doubled table names the attributes table, not an images table nobody gave
    code, err = _cb(tmp_path, pl.concat([good, good]), capsys)
    assert code == 2 and "attributes table" in err and "images table" not in err


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda f: f.clear(), "is empty"),
        (lambda f: f.with_columns(pl.lit(3).alias("label")), "column label has type Int"),
        (lambda f: f.drop("cohort"), "lacks column(s) cohort"),
        (
            lambda f: f.with_columns(
                pl.when(pl.int_range(pl.len()) == 4)
                .then(None)
                .otherwise(pl.col("role"))
                .alias("role")
            ),
            "column role: 1 row(s) are null (rows [4])",
        ),
        (lambda f: f.with_columns(pl.lit("CA-X").alias("condition")), "allowed: CF, CA-R, CA-U"),
        (lambda f: f.with_columns(pl.lit("Unknown").alias("label")), "unknown, none or empty"),
    ],
)
def test_contextbias_metrics_refuse_bad_tables(tmp_path, capsys, mutate, needle):
    code, err = _cb(tmp_path, mutate(_attributes()), capsys)
    assert code == 2 and needle in err, err
    assert err.startswith("stereolens: error: attributes table")


def _responses(n=4):
    rows = []
    for g in ("female", "male"):
        for i in range(n):
            base = {"model": "v", "setting": "image", "axis": "gender", "group": g}
            rows.append(
                {**base, "task": "story", "image_id": f"{g}{i}", "prompt_id": "s", "response": "x"}
            )
            rows.append(
                {
                    **base,
                    "task": "exam",
                    "image_id": f"{g}{i}",
                    "prompt_id": "q",
                    "response": "A",
                    "subject": "college_physics",
                    "correct": i % 2 == 0,
                }
            )
    return pl.DataFrame(rows)


def _lv(tmp_path, frame, capsys):
    path = tmp_path / "responses.parquet"
    frame.write_parquet(path)
    argv = ["lvlm", "metrics", "--responses", str(path), "--out", str(tmp_path / "lv")]
    return _run(argv + ["--preset", '{"metrics": {"replicates": 5, "permutations": 5}}'], capsys)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda f: f.drop("response"), "lacks column(s) response"),
        (lambda f: f.clear(), "is empty"),
        (lambda f: pl.concat([f, f.head(2)]), "repeat the key"),
        (lambda f: f.with_columns(pl.col("correct").cast(pl.String)), "column correct has type"),
        # the long texts are checked from the file's schema (the table is read lazily)
        (lambda f: f.with_columns(pl.lit(1).alias("response")), "column response has type"),
        (
            lambda f: f.with_columns(
                pl.when(pl.int_range(pl.len()) == 0)
                .then(None)
                .otherwise(pl.col("group"))
                .alias("group")
            ),
            "column group: 1 row(s) are null",
        ),
    ],
)
def test_lvlm_metrics_refuse_bad_tables(tmp_path, capsys, mutate, needle):
    assert _lv(tmp_path, _responses(), capsys)[0] == 0
    code, err = _lv(tmp_path, mutate(_responses()), capsys)
    assert code == 2 and needle in err, err
    assert len(err.strip().splitlines()) == 1


def test_biasig_metrics_refuse_an_empty_answers_table(tmp_path, capsys):
    path = tmp_path / "answers.parquet"
    pl.DataFrame(
        schema={
            c: pl.String
            for c in ("model", "prompt_id", "image_id", "position", "gender", "race", "age")
        }
    ).write_parquet(path)
    code, err = _run(["biasig", "metrics", "--answers", str(path), "--out", str(tmp_path)], capsys)
    assert code == 2 and "answers table" in err and "is empty" in err


def test_categorical_columns_are_accepted_as_text():
    frame = _attributes().with_columns(pl.col("model", "role").cast(pl.Categorical))
    out = check_table(frame, ATTRIBUTES)
    assert out.schema["model"] == pl.String
    with pytest.raises(ConfigError, match="responses table"):
        check_table(_responses().drop("axis"), RESPONSES)


def test_a_lazy_table_is_checked_without_loading_its_long_texts(tmp_path):
    path = tmp_path / "responses.parquet"
    _responses().with_columns(pl.col("group").cast(pl.Categorical)).write_parquet(path)
    out = check_table(pl.scan_parquet(path), RESPONSES, str(path))
    assert isinstance(out, pl.LazyFrame)
    assert out.collect_schema()["group"] == pl.String  # check_table's casts, lazily
    assert out.collect().equals(_responses())
    with pytest.raises(ConfigError, match="repeat the key"):
        check_table(pl.concat([pl.scan_parquet(path)] * 2), RESPONSES)
