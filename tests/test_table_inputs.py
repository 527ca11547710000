"""Input tables of the metrics CLIs (issue 24, items 1, 2 and 6): closed vocabularies read
by one rule (whitespace and case ignored) or refused with the column, the value and the
rows; the numbers a formula needs refused when NaN, infinite or negative; and every format
a CLI's --help names scoring as its parquet copy."""

import json
import shutil

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from stereolens.biasig.prompts import load_prompts
from stereolens.biasig.truth import load_truth
from stereolens.cli import main
from stereolens.paths import resource
from stereolens.tables import TableSpec, check_table
from stereolens.validation import ConfigError
from stereolens.vocabulary import Vocabulary, vocabulary_key


def _run(argv, capsys):
    code = main(argv)
    return code, capsys.readouterr().err


def _edit(frame, column, rows, value):
    """``frame`` with ``column`` set to ``value`` on the rows numbered ``rows``."""
    at = pl.int_range(pl.len()).is_in(list(rows))
    return frame.with_columns(
        pl.when(at).then(pl.lit(value)).otherwise(pl.col(column)).alias(column)
    )


# ----------------------------------------------------------------------------- the rule
def test_the_rule_maps_onto_exactly_one_allowed_value():
    assert vocabulary_key("  Neutral\t") == "neutral"
    assert vocabulary_key("East   ASIAN") == "east asian"
    spec = TableSpec(
        what="t",
        unit="row",
        text=("a",),
        vocabularies=(Vocabulary("a", ("White", "white", "Black")),),
    )
    frame = pl.DataFrame({"a": [" black", "Black", "WHITE"]})
    # " black" reads as Black; WHITE matches two allowed values: refused, not guessed
    with pytest.raises(
        ConfigError, match=r"column a: 1 row\(s\) could each be any of \['White', 'white'\]"
    ):
        check_table(frame, spec)
    assert check_table(frame.head(2), spec)["a"].to_list() == ["Black", "Black"]


# ----------------------------------------------------------------------------- ContextBias
def _color_table():
    """17 attribute rows of color_temperature, every one "neutral" (BI 0 for every cell),
    and two of items (open vocabulary), over two roles and three conditions."""
    rows = []
    for role in ("r0", "r1"):
        for cond in ("CF", "CA-R", "CA-U"):
            for i in range(3):
                rows.append((role, cond, f"{role}-{cond}-{i}"))
    rows = rows[:17]
    att = [
        {
            "model": "m",
            "role": role,
            "condition": cond,
            "image_id": image,
            "cohort": "scene",
            "dimension": "color_temperature",
            "label": "neutral",
        }
        for role, cond, image in rows
    ]
    att += [
        {**att[0], "cohort": "objects", "dimension": "items", "label": "red car"},
        {**att[5], "cohort": "objects", "dimension": "items", "label": "a lamp"},
    ]
    return pl.DataFrame(att)


def _cb(tmp_path, frame, capsys, name="attributes.parquet", out="out"):
    path = tmp_path / name
    {"parquet": frame.write_parquet, "csv": frame.write_csv, "jsonl": frame.write_ndjson}[
        name.rsplit(".", 1)[1]
    ](path)
    argv = ["contextbias", "metrics", "--attributes", str(path), "--out", str(tmp_path / out)]
    return _run(argv + ["--preset", '{"metrics": {"replicates": 5, "matched_draws": 1}}'], capsys)


def _bi(tmp_path, out="out"):
    return pl.read_parquet(tmp_path / out / "bi.parquet").filter(
        (pl.col("dimension") == "color_temperature") & (pl.col("aggregation") == "pooled")
    )


def test_contextbias_label_spelling_is_normalised_not_counted_apart(tmp_path, capsys):
    clean = _color_table()
    assert _cb(tmp_path, clean, capsys)[0] == 0
    want = _bi(tmp_path)
    assert set(want["bi"].to_list()) == {0.0} and set(want["k"].drop_nulls()) == {1}
    # " Neutral" on 9 of the 17 rows: once BI 0.0148 (CA-R, CA-U) and 0.0817 (CF), K 2
    edited = _edit(clean, "label", range(0, 17, 2), " Neutral")
    code, err = _cb(tmp_path, edited, capsys, out="edited")
    assert code == 0, err
    assert "column label: read ' Neutral' -> 'neutral'" in err
    assert_frame_equal(_bi(tmp_path, "edited"), want)


@pytest.mark.parametrize(
    ("column", "value", "needle"),
    [
        ("label", "neutrall", "value 'neutrall' for dimension color_temperature (rows [0, 2, 4"),
        ("dimension", "colour_temperature", "column dimension: 9 row(s) are outside its vocab"),
        ("cohort", "people", "value 'people' for dimension color_temperature"),
    ],
)
def test_contextbias_value_outside_the_schema_is_refused(tmp_path, capsys, column, value, needle):
    edited = _edit(_color_table(), column, range(0, 17, 2), value)
    code, err = _cb(tmp_path, edited, capsys)
    assert code == 2 and needle in err, err
    assert err.startswith("stereolens: error: attributes table") and "fix or drop them" in err
    assert len(err.strip().splitlines()) == 1


def test_contextbias_open_dimensions_are_not_refused(tmp_path, capsys):
    edited = _edit(_color_table(), "label", [17], "Red Sports Car")
    assert _cb(tmp_path, edited, capsys)[0] == 0


def test_contextbias_two_spellings_of_one_label_in_one_image_repeat_the_key(tmp_path, capsys):
    clean = _color_table()
    doubled = pl.concat([clean, clean.head(1).with_columns(pl.lit("NEUTRAL").alias("label"))])
    code, err = _cb(tmp_path, doubled, capsys)
    assert code == 2 and "repeat the key" in err


# ----------------------------------------------------------------------------- LVLM
def _responses():
    """Responses built like the demo's: story, exam and attribute-inferring rows for two
    genders, the phrase rules' refusal columns, refusal_judge all null (no judge)."""
    rows = []
    for g in ("female", "male"):
        for i in range(4):
            base = {"model": "v", "setting": "image", "axis": "gender", "group": g}
            base |= {"image_id": f"{g}{i}", "stratum": f"s{i % 2}"}
            rows.append({**base, "task": "story", "prompt_id": "s", "response": "a story"})
            rows.append(
                {
                    **base,
                    "task": "exam",
                    "prompt_id": f"q{i % 2}",
                    "response": "A",
                    "subject": "college_physics",
                    "correct": (i + (g == "male")) % 3 == 0,
                }
            )
            refused = g == "female" and i == 0
            rows.append(
                {
                    **base,
                    "task": "attribute_inferring",
                    "prompt_id": "ai",
                    "response": "I cannot tell" if refused else "a nurse",
                }
            )
    frame = pl.DataFrame(rows)
    return frame.with_columns(
        pl.col("response").str.starts_with("I cannot").alias("refusal_rule"),
        pl.when(pl.col("response").str.starts_with("I cannot"))
        .then(pl.lit("I cannot"))
        .alias("refusal_phrase"),
        pl.lit(None, pl.Boolean).alias("refusal_judge"),
        pl.lit(False).alias("empty"),
    ).with_columns(pl.col("refusal_rule").alias("refusal"))


def _story_attributes():
    rows = []
    for g, values in (("female", ["nurse"] * 3 + ["doctor"]), ("male", ["doctor"] * 3 + ["nurse"])):
        for i, v in enumerate(values):
            rows.append(
                {
                    "model": "v",
                    "setting": "image",
                    "axis": "gender",
                    "group": g,
                    "image_id": f"{g}{i}",
                    "prompt_id": "s",
                    "attribute": "occupation",
                    "value": v,
                }
            )
    return pl.DataFrame(rows)


WRITERS = {
    "parquet": lambda f, p: f.write_parquet(p),
    "csv": lambda f, p: f.write_csv(p),
    "jsonl": lambda f, p: f.write_ndjson(p),
}


def _lv(tmp_path, frame, capsys, fmt="parquet", out="lv"):
    folder = tmp_path / f"in-{out}"
    folder.mkdir()
    WRITERS[fmt](frame, folder / f"responses.{fmt}")
    WRITERS[fmt](_story_attributes(), folder / f"story_attributes.{fmt}")
    argv = ["lvlm", "metrics", "--responses", str(folder / f"responses.{fmt}")]
    argv += ["--preset", '{"metrics": {"min_count": 2, "replicates": 20, "permutations": 20}}']
    argv += ["--out", str(tmp_path / out)]
    return _run(argv, capsys)


LVLM_TABLES = ("scores", "prompt_scores", "refusals", "story_skew", "exam_accuracy")


def test_lvlm_group_spelling_is_normalised_not_a_new_group(tmp_path, capsys):
    assert _lv(tmp_path, _responses(), capsys)[0] == 0
    # " Female" on the 4 female exam rows and 2 story rows: once a group of its own
    female = _responses().with_row_index().filter(pl.col("group") == "female")
    rows = female.filter(pl.col("task") == "exam")["index"].to_list()
    rows += female.filter(pl.col("task") == "story")["index"].head(2).to_list()
    edited = _edit(_responses(), "group", rows, " Female")
    assert edited["group"].n_unique() == 3 and len(rows) == 6
    code, err = _lv(tmp_path, edited, capsys, out="edited")
    assert code == 0, err
    for name in LVLM_TABLES:
        want = pl.read_parquet(tmp_path / "lv" / f"{name}.parquet")
        assert_frame_equal(pl.read_parquet(tmp_path / "edited" / f"{name}.parquet"), want)


def test_lvlm_group_outside_the_axis_is_refused(tmp_path, capsys):
    edited = _edit(_responses(), "group", [1, 4], "femme")
    code, err = _lv(tmp_path, edited, capsys)
    assert code == 2, err
    assert "responses table" in err and "column group: 2 row(s) are outside its vocabulary" in err
    assert "value 'femme' for axis gender (rows [1, 4]); allowed: female, male" in err


# ----------------------------------------------------------------------------- BiasIG
@pytest.fixture(scope="module")
def prompts():
    return load_prompts()


def _ids(prompts):
    def pid(source_file, attribute):
        row = prompts.filter(
            (pl.col("source_file") == source_file)
            & (pl.col("acquired_attribute") == attribute)
            & (pl.col("variant_index") == 0)
        )
        return row["prompt_id"][0]

    return {
        "female": pid("occupation/oc_female.txt", "Nurse"),
        "black": pid("occupation/oc_black.txt", "Nurse"),
        "implicit": pid("implicit/oc.txt", "Nurse"),
        "pair": pid("relation/gender/sr_female_male.txt", "Employer-Employee"),
    }


def _answers(prompts):
    ids = _ids(prompts)
    rows = []

    def add(p, image, position="single", g="unknown", r="unknown", a="unknown"):
        rows.append(
            {
                "model": "m",
                "prompt_id": ids[p],
                "image_id": image,
                "position": position,
                "gender": g,
                "race": r,
                "age": a,
                "status": "ok",
            }
        )

    for i, g in enumerate(["female", "female", "male", "unknown"]):
        add("female", f"f{i}", g=g, r="White", a="young")
    for i, r in enumerate(["Black", "White", "East Asian"]):
        add("black", f"b{i}", r=r, g="female", a="elderly")
    for i, (g, r) in enumerate([("female", "White"), ("male", "Black"), ("female", "South Asian")]):
        add("implicit", f"i{i}", g=g, r=r, a="middle-aged")
    for i, (left, right) in enumerate([("female", "male"), ("female", "female")]):
        add("pair", f"p{i}", "left", left)
        add("pair", f"p{i}", "right", right)
    return pl.DataFrame(rows)


def _bg(tmp_path, frame, capsys, fmt="parquet", out="bg", prompts_path=None):
    path = tmp_path / f"answers-{out}.{fmt}"
    WRITERS[fmt](frame, path)
    argv = ["biasig", "metrics", "--answers", str(path), "--out", str(tmp_path / out)]
    argv += ["--preset", '{"replicates": 20, "ceiling_draws": 5}', "--threads", "1"]
    if prompts_path is not None:
        argv += ["--prompts", str(prompts_path)]
    return _run(argv, capsys)


def test_biasig_value_outside_its_vocabulary_names_its_rows(tmp_path, capsys, prompts):
    answers = _answers(prompts)
    assert _bg(tmp_path, answers, capsys)[0] == 0
    # spellings the rule and ANSWER_ALIASES read: the same scores
    spelled = _edit(_edit(answers, "gender", [0, 1], " Woman"), "race", [4], "black ")
    code, err = _bg(tmp_path, spelled, capsys, out="spelled")
    assert code == 0, err
    for name in ("implicit", "explicit", "eta"):
        want = pl.read_parquet(tmp_path / "bg" / f"{name}.parquet")
        assert_frame_equal(pl.read_parquet(tmp_path / "spelled" / f"{name}.parquet"), want)
    code, err = _bg(tmp_path, _edit(answers, "race", [5, 6], "Martian"), capsys, out="bad")
    assert code == 2
    assert "answers table" in err and "column race: 2 row(s) are outside its vocabulary" in err
    assert "value 'Martian' (rows [5, 6]); allowed: White, Black, East Asian, South Asian" in err


@pytest.mark.parametrize(("value", "what"), [(float("nan"), "NaN"), (-1.0, "negative")])
def test_biasig_prompt_weight_must_be_a_number(tmp_path, capsys, prompts, value, what):
    # one NaN weight once blanked 106 of 192 explicit.parquet rows (status "missing"), exit 0
    row = prompts.with_row_index().filter(pl.col("prompt_id") == _ids(prompts)["female"])
    row = int(row["index"][0])
    bad = _edit(prompts, "weight", [row], value)
    bad.write_parquet(tmp_path / "prompts.parquet")
    code, err = _bg(tmp_path, _answers(prompts), capsys, prompts_path=tmp_path / "prompts.parquet")
    assert code == 2, err
    assert f"prompt table {tmp_path / 'prompts.parquet'}: column weight: 1 row(s) are {what}" in err
    assert f"(rows [{row}])" in err


@pytest.mark.parametrize("constant", ["NaN", "Infinity"])
def test_biasig_truth_refuses_nan_shares(tmp_path, constant):
    folder = tmp_path / "truth"
    shutil.copytree(resource("biasig", "truth"), folder)
    weights = json.loads((folder / "weight.json").read_text())
    first = next(iter(weights))
    text = (folder / "weight.json").read_text()
    text = text.replace(f'"{first}": {json.dumps(weights[first])}', f'"{first}": {constant}', 1)
    (folder / "weight.json").write_text(text)
    with pytest.raises(ConfigError, match=f"weight.json cannot be read as JSON: {constant}"):
        load_truth(folder)


# ----------------------------------------------------------------------------- formats
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_every_metrics_cli_reads_csv_and_json_lines_as_parquet(tmp_path, capsys, prompts, fmt):
    cb = _color_table()
    assert _cb(tmp_path, cb, capsys)[0] == 0
    code, err = _cb(tmp_path, cb, capsys, name=f"attributes.{fmt}", out=f"cb-{fmt}")
    assert code == 0, err
    for name in ("bi", "ccs", "ccs_mean", "robustness", "bootstrap"):
        want = pl.read_parquet(tmp_path / "out" / f"{name}.parquet")
        assert_frame_equal(pl.read_parquet(tmp_path / f"cb-{fmt}" / f"{name}.parquet"), want)

    # the all-null refusal_judge column once read back from CSV as text and crashed
    assert _lv(tmp_path, _responses(), capsys)[0] == 0
    code, err = _lv(tmp_path, _responses(), capsys, fmt=fmt, out=f"lv-{fmt}")
    assert code == 0, err
    for name in LVLM_TABLES:
        want = pl.read_parquet(tmp_path / "lv" / f"{name}.parquet")
        assert_frame_equal(pl.read_parquet(tmp_path / f"lv-{fmt}" / f"{name}.parquet"), want)

    answers = _answers(prompts).with_columns(pl.lit(None, pl.String).alias("variant"))
    answers = answers.with_columns(pl.col("model").alias("variant"))
    assert _bg(tmp_path, answers, capsys)[0] == 0
    code, err = _bg(tmp_path, answers, capsys, fmt=fmt, out=f"bg-{fmt}")
    assert code == 0, err
    for name in ("implicit", "explicit", "eta"):
        want = pl.read_parquet(tmp_path / "bg" / f"{name}.parquet")
        assert_frame_equal(pl.read_parquet(tmp_path / f"bg-{fmt}" / f"{name}.parquet"), want)


# ----------------------------------------------------------------------------- merges
def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_contextbias_merge_refuses_a_label_the_schema_lacks(tmp_path):
    from stereolens.contextbias.merge import merge_extractions
    from stereolens.contextbias.schema import AttributeSchema

    schema = AttributeSchema.load()
    answer = {
        "scene": {
            "mood": "calm",
            "color_temperature": " Neutral",
            "aesthetic_qualities": [],
            "dominant_colors": [],
            "weather": "unknown",
        },
        "camera": {"depth_of_field": "shallow", "framing": "medium", "perspective": "eye_level"},
        "objects": {"items": ["Red Car"]},
        "people": [],
    }
    base = {"extractor": "x", "model": "m", "role": "nurse", "condition": "CF", "seed": 1}
    base |= {"prompt_id": "p", "status": "ok", "attempts": 1}
    path = _jsonl(tmp_path / "s.jsonl", [{**base, "image_id": "a", "attributes": answer}])
    attrs, _ = merge_extractions([path], schema)
    labels = dict(attrs.select("dimension", "label").iter_rows())
    assert labels["color_temperature"] == "neutral" and labels["items"] == "red car"
    answer["scene"]["color_temperature"] = "neutrall"
    _jsonl(path, [{**base, "image_id": "a", "attributes": answer}])
    with pytest.raises(ConfigError, match="value 'neutrall' for dimension color_temperature"):
        merge_extractions([path], schema)


def test_lvlm_merge_reads_group_spellings_and_refuses_unknown_groups(tmp_path):
    from stereolens.lvlm.merge import RESPONSE_DTYPES, TABLES, merge_model_tables

    rows = []
    for i, group in enumerate(["female", " Female", "male", "MALE "]):
        row = dict.fromkeys(RESPONSE_DTYPES)
        row |= {"model": "v", "setting": "image", "task": "story", "axis": "gender"}
        row |= {"group": group, "image_id": f"u{i}", "prompt_id": "s", "response": "x"}
        rows.append(row)
    shard = _jsonl(tmp_path / "r.jsonl", rows)
    out = {name: tmp_path / f"{name}.parquet" for name in TABLES}
    kwargs = {"refusal_paths": [], "story_paths": [], "judgement_paths": [], "out": out}
    merge_model_tables(response_paths=[shard], **kwargs)
    assert (
        pl.read_parquet(out["responses"])["group"].to_list() == ["female", "female"] + ["male"] * 2
    )
    _jsonl(shard, [*rows, {**rows[0], "group": "femme", "image_id": "u9"}])
    with pytest.raises(ConfigError, match=r"value 'femme' for axis gender \(rows \[4\]\)"):
        merge_model_tables(response_paths=[shard], **kwargs)


def test_biasig_merge_reads_value_spellings_and_refuses_unknown_values(tmp_path):
    from stereolens.biasig.merge import ANSWER_DTYPES, merge_model_answers

    row = dict.fromkeys(ANSWER_DTYPES) | {"model": "m", "prompt_id": "p", "status": "ok"}
    rows = [
        row | {"image_id": "a", "position": "single", "gender": " Female", "race": "east asian"},
        row | {"image_id": "b", "position": "Single", "gender": "male", "race": "unknown"},
    ]
    shard = _jsonl(tmp_path / "v.jsonl", rows)
    merge_model_answers([shard], tmp_path / "answers.parquet", None)
    merged = pl.read_parquet(tmp_path / "answers.parquet")
    assert merged.select("position", "gender", "race").rows() == [
        ("single", "female", "East Asian"),
        ("single", "male", "unknown"),
    ]
    _jsonl(shard, [*rows, row | {"image_id": "c", "position": "single", "gender": "robot"}])
    with pytest.raises(
        ConfigError, match=r"column gender: 1 row\(s\) are outside .* \(rows \[2\]\)"
    ):
        merge_model_answers([shard], tmp_path / "answers.parquet", None)
