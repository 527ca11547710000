"""The human sample of the LVLM reader correction (issue 21, items 2 and 3): the stratified
draw of stories and judged term pairs by hand, the two text forms and their keys, and the
round trip answers -> human-label table -> lvlm correct, with a case computed by hand; a
race axis (7 groups, 21 judged pairs per round) through lvlm correct and its CLI."""

from __future__ import annotations

import csv
import json
import math

import polars as pl
import pytest
from scipy import stats

from stereolens.annotation_form import CSV_COLUMNS, KEY_SCHEMA
from stereolens.config import load_config
from stereolens.lvlm.corrected import (
    corrected_scores,
    story_reader,
    term_estimator,
    term_reader,
)
from stereolens.lvlm.reader_forms import human_labels_from_answers
from stereolens.lvlm.reader_sample import (
    FILES,
    export_reader_sample,
    labels_needed,
    plan_strata,
)
from stereolens.metrics import human_labels as hl
from stereolens.metrics import reader_correction as rc
from stereolens.metrics import reader_double as rd

Z = float(stats.norm.ppf(0.975))
STORY = {  # image -> (occupation, socioeconomic_status, hobbies)
    "f1": ("nurse", "middle class", ("hiking",)),
    "f2": ("nurse", "middle class", ("chess", "hiking")),
    "f3": ("teacher", "working class", ()),
    "f4": ("nurse", "wealthy", ("sailing",)),
    "m1": ("surgeon", "wealthy", ("sailing",)),
    "m2": ("nurse", "middle class", ("chess",)),
    "m3": ("surgeon", "wealthy", ()),
    "m4": ("welder", "working class", ("chess", "cycling")),
    "m5": ("surgeon", "middle class", ("hiking",)),
    "m6": ("teacher", "wealthy", ("sailing",)),
    "m7": ("welder", "working class", ("chess",)),
    "m8": ("surgeon", "wealthy", ()),
}


def lvlm_tables(story: dict | None = None, winners: tuple[str, ...] = ("female", "male", "male")):
    """responses, story_attributes and term_judgements of one model, setting and axis:
    a story per user image of ``story`` (female f*, male m*), one term with a round per
    winner (the k-th explanation of each group, A/B alternating)."""
    story = STORY if story is None else story
    keys = {"model": "m", "setting": "image", "axis": "gender", "shard": 0}
    rows, attrs = [], []
    for image, (occupation, status, hobbies) in story.items():
        group = "female" if image.startswith("f") else "male"
        text = f"Sam works as a {occupation}; Sam is {status}. Hobbies: {', '.join(hobbies)}."
        rows.append({**keys, "task": "story", "group": group, "image_id": image,
                     "prompt_id": "p1", "response": text})  # fmt: skip
        values = [("occupation", occupation), ("socioeconomic_status", status)]
        values += [("hobbies", h) for h in hobbies]
        attrs += [{**keys, "group": group, "image_id": image, "prompt_id": "p1",
                   "attribute": a, "value": v} for a, v in values]  # fmt: skip
    judged = []
    for k, winner in enumerate(winners):
        for group in ("female", "male"):
            image = f"t{group[0]}{k}"
            text = f"explanation {image} of entropy"
            rows.append({**keys, "task": "term", "group": group, "image_id": image,
                         "prompt_id": "t1", "response": text})  # fmt: skip
        a, b = ("female", "male") if k % 2 == 0 else ("male", "female")
        judged.append({"model": "m", "setting": "image", "axis": "gender", "prompt_id": "t1",
                       "pair_index": k, "group_a": a, "group_b": b, "image_id_a": f"t{a[0]}{k}",
                       "image_id_b": f"t{b[0]}{k}", "term": "Entropy", "domain": "physics",
                       "answer": "A" if winner == a else "B", "winner": winner})  # fmt: skip
    return pl.DataFrame(rows), pl.DataFrame(attrs).drop("shard"), pl.DataFrame(judged)


def write_answers(path, key: pl.DataFrame, answer, annotator="ann") -> str:
    """An annotator's CSV as the form saves it: one row per set x question, ``answer(set
    row, dimension)`` the label typed or chosen."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(CSV_COLUMNS)
        for row in key.iter_rows(named=True):
            for dim in row["dimensions"]:
                out.writerow([annotator, row["set_id"], dim, answer(row, dim), 1])
    return str(path)


def reader_answer(story: dict, winners: tuple[str, ...]):
    """The answers of a human who agrees with the reader everywhere."""

    def answer(row, dim):
        if row["task"] == "term":
            # item_id model/setting/axis/prompt_id/pair_index/group_a/group_b
            k = int(row["item_id"].split("/")[4])
            return "A" if winners[k] == row["group_a"] else "B"
        occupation, status, hobbies = story[row["image_ids"][0]]
        got = {"occupation": occupation, "socioeconomic_status": status}
        return got.get(dim) or ("; ".join(hobbies) if hobbies else "cannot tell")

    return answer


# ---------------------------------------------------------------- the draw, by hand


def test_draw_strata_sizes_and_probabilities_by_hand(tmp_path):
    responses, story, term = lvlm_tables()
    paths = export_reader_sample(
        responses, story, term, tmp_path, target_width=0.72,
        disagreement={"story": 0.04, "term": 0.03}, seed=3,
    )  # fmt: skip
    design = pl.read_parquet(paths["design"]).sort("stratum")
    assert design["stratum"].to_list() == [
        "m|image|gender|p1|female", "m|image|gender|p1|male", "m|image|gender|t1",
    ]  # fmt: skip
    # story, one allocation over the model's 12 stories: W = (4/12, 8/12), S^2 = 0.04;
    # room = (0.72 / 2z)^2 - 0.25 / 12 = 0.012904; n = 0.04 / room = 3.0998 (equal rates:
    # Neyman = proportional); n_h = ceil(n W_h) = (ceil 1.033, ceil 2.067) = (2, 3)
    room = (0.72 / (2 * Z)) ** 2 - 0.25 / 12
    assert 0.04 / room == pytest.approx(3.0998, abs=1e-4)
    assert design["n_items"].to_list() == [4, 8, 3]
    assert design["n_human"].to_list() == [2, 3, 3]
    assert design["selection_probability"].to_list() == pytest.approx([0.5, 0.375, 1.0])
    # planned width: V = 0.25/12 + (1/3)^2 0.04 / 2 + (2/3)^2 0.04 / 3
    v = 0.25 / 12 + 0.04 / 9 / 2 + 4 * 0.04 / 9 / 3
    story_rows = design.filter(pl.col("task") == "story")
    assert story_rows["width"].to_list() == pytest.approx([2 * Z * math.sqrt(v)] * 2)
    assert story_rows["reachable"].all()
    # term: 3 rounds; a perfect reader's variance 0.25 / 3 alone exceeds (0.72 / 2z)^2:
    # not reachable, every round
    term_row = design.filter(pl.col("task") == "term")
    assert term_row["reachable"].to_list() == [False] and term_row["n_human"].to_list() == [3]
    assert set(design["model"]) == {"m"} and design["disagreement"].to_list() == [0.04] * 2 + [0.03]
    # the template: every drawn story x its 3 attributes, every round x winner
    template = pl.read_csv(paths["template"])
    assert template.height == 5 * 3 + 3 and (template["label"].fill_null("") == "").all()
    drawn = template.filter(pl.col("attribute") == "occupation")
    assert drawn.group_by("stratum").len().sort("stratum")["len"].to_list() == [2, 3]
    assert set(drawn.filter(pl.col("stratum").str.ends_with("male") & ~pl.col(
        "stratum").str.ends_with("female"))["selection_probability"]) == {0.375}  # fmt: skip
    # the keys: one set per drawn story and per judged pair, blinded (no group shown)
    story_key, term_key = (pl.read_parquet(paths[f"{t}_key"]) for t in ("story", "term"))
    assert story_key.height == 5 and term_key.height == 3
    assert list(story_key.columns[: len(KEY_SCHEMA)]) == list(KEY_SCHEMA)
    assert story_key["dimensions"][0].to_list() == ["occupation", "socioeconomic_status", "hobbies"]
    questions = json.loads(story_key["questions"][0])
    assert questions["socioeconomic_status"]["vocabulary"][:2] == ["poor", "working class"]
    assert questions["hobbies"] == {"vocabulary": None, "multiple": True}
    form = paths["story_form"].read_text()
    assert "female" not in form and "Sam works as a" in form
    assert 'list="choices-occupation"' in form and '<option value="surgeon">' in form
    term_form = paths["term_form"].read_text()
    assert "Explanation A of" in term_form and "female" not in term_form.split("<script>")[0]
    # the same seed draws the same sample; another seed another (one stratum has a choice)
    again = export_reader_sample(
        responses, story, term, tmp_path / "again", target_width=0.72,
        disagreement={"story": 0.04, "term": 0.03}, seed=3,
    )  # fmt: skip
    assert pl.read_csv(again["template"]).equals(template)


# ---------------------------------------------------------------- the round trip


def test_round_trip_agreeing_humans_leave_the_scores(tmp_path):
    """answers that agree with the reader -> human-labels -> lvlm correct: corrected ==
    naive (PPI with lam = 1: the rectifier is 0) in both tasks, on a drawn sample."""
    winners = ("female", "male", "male")
    responses, story, term = lvlm_tables(winners=winners)
    paths = export_reader_sample(
        responses, story, term, tmp_path, target_width=0.72,
        disagreement={"story": 0.04, "term": 0.03}, seed=3,
    )  # fmt: skip
    answer = reader_answer(STORY, winners)
    files = [
        write_answers(tmp_path / f"{t}.csv", pl.read_parquet(paths[f"{t}_key"]), answer)
        for t in ("story", "term")
    ]
    human = human_labels_from_answers(
        files, [paths["story_key"], paths["term_key"]], paths["template"]
    )
    assert list(human.columns) == list(hl.HUMAN_COLUMNS)
    # f2's hobbies are two labels; a story without hobbies is labelled unknown
    assert human.filter(pl.col("attribute") == "hobbies").height >= 5
    sr, tr = story_reader(story, responses), term_reader(term)
    table, left_out = corrected_scores(sr, tr, human, min_count=1, replicates=50)
    assert left_out.height == 0 and set(table["metric"]) == {"story", "term"}
    assert table["corrected"].to_numpy() == pytest.approx(table["naive"].to_numpy())
    assert table.filter(pl.col("metric") == "story")["n_human"].item() == 5 * 3
    # term, naive: r = (1/3, 2/3), e = (1/2, 1/2): 1/2 (1/6 + 1/6) x 100 = 16.67
    assert table.filter(pl.col("metric") == "term")["naive"].item() == pytest.approx(100 / 6)


def test_round_trip_by_hand_with_every_item_labelled(tmp_path):
    """Every item drawn (the width is not reachable): the corrected shares are the humans'
    own, so the corrected scores are those of the human labels, by hand; three annotators,
    the consensus the majority."""
    story = {"f1": ("nurse", "poor", ()), "f2": ("nurse", "poor", ()),
             "m1": ("nurse", "poor", ()), "m2": ("doctor", "poor", ())}  # fmt: skip
    winners = ("female", "female", "female", "male")
    responses, attrs, term = lvlm_tables(story, winners)
    paths = export_reader_sample(
        responses, attrs, term, tmp_path, target_width=0.01,
        disagreement={"story": 0.1, "term": 0.1},
    )  # fmt: skip
    design = pl.read_parquet(paths["design"])
    assert (design["selection_probability"] == 1.0).all() and not design["reachable"].any()
    # the humans: f2 is a doctor, and the judge's pair 1 went to male
    truth = {**story, "f2": ("doctor", "poor", ())}
    right = reader_answer(truth, ("female", "male", "female", "male"))
    wrong = reader_answer(story, winners)
    files = []
    for name, how in (("x", right), ("y", right), ("z", wrong)):
        for t in ("story", "term"):
            key = pl.read_parquet(paths[f"{t}_key"])
            files.append(write_answers(tmp_path / f"{name}_{t}.csv", key, how, name))
    human = human_labels_from_answers(
        files, [paths["story_key"], paths["term_key"]], paths["template"]
    )
    occupation = dict(human.filter(pl.col("attribute") == "occupation").select(
        pl.col("item_id").str.split("/").list.get(3), "label").iter_rows())  # fmt: skip
    assert occupation == {"f1": "nurse", "f2": "doctor", "m1": "nurse", "m2": "doctor"}
    sr, tr = story_reader(attrs, responses), term_reader(term)
    table, _ = corrected_scores(sr, tr, human, min_count=1, replicates=50)
    got = {m: (n, c) for m, n, c in table.select("metric", "naive", "corrected").iter_rows()}
    # story, naive: nurse rates (1, 0.5) -> p (2/3, 1/3), TVD 1/6, n_v 3; doctor (0, 0.5) ->
    # TVD 1/2, n_v 1; poor (1, 1): TVD 0, n_v 4; (3/6 + 1/2 + 0) / 8 x 100 = 12.5.
    # Humans: nurse and doctor (0.5, 0.5) each, poor (1, 1): TVD 0 everywhere.
    assert got["story"] == pytest.approx((12.5, 0.0))
    # term, naive: r = (3/4, 1/4): 25; humans (1/2, 1/2): 0
    assert got["term"] == pytest.approx((25.0, 0.0))


def test_answers_against_the_wrong_key_are_refused(tmp_path):
    responses, story, term = lvlm_tables()
    paths = export_reader_sample(responses, story, term, tmp_path, target_width=0.72)
    answer = reader_answer(STORY, ("female", "male", "male"))
    story_csv = write_answers(tmp_path / "s.csv", pl.read_parquet(paths["story_key"]), answer)
    with pytest.raises(ValueError, match="belong to 0 of the 1 keys"):
        human_labels_from_answers([story_csv], [paths["term_key"]], paths["template"])
    # a label outside a closed question's vocabulary, named by the form's reader
    key = pl.read_parquet(paths["story_key"])
    bad = write_answers(
        tmp_path / "bad.csv", key, lambda r, d: "rich" if d == "socioeconomic_status" else "x"
    )
    with pytest.raises(ValueError, match="'rich' is not a socioeconomic_status label"):
        human_labels_from_answers([bad], [paths["story_key"]], paths["template"])


def test_cli_reader_sample_and_human_labels(tmp_path, capsys):
    """`stereolens lvlm reader-sample` -> answers -> `lvlm human-labels` -> `lvlm correct`."""
    from stereolens.cli import main

    winners = ("female", "male", "male")
    responses, story, term = lvlm_tables(winners=winners)
    run = tmp_path / "run"
    run.mkdir()
    responses.write_parquet(run / "responses.parquet")
    story.write_parquet(run / "story_attributes.parquet")
    term.write_parquet(run / "term_judgements.parquet")
    form = tmp_path / "form"
    preset = '{"reader_sample": {"target_width": 0.72, "disagreement": {"story": 0.04}}}'
    argv = ["lvlm", "reader-sample", "--responses", str(run / "responses.parquet")]
    assert main([*argv, "--out", str(form), "--preset", preset]) == 0
    out = capsys.readouterr().out
    assert "m story: 5 of 12 stories in 2 strata" in out
    assert "m term: 3 of 3 judged term pairs in 1 strata" in out
    answer = reader_answer(STORY, winners)
    files = [
        write_answers(tmp_path / f"{t}.csv", pl.read_parquet(form / t / "key.parquet"), answer)
        for t in ("story", "term")
    ]
    human = tmp_path / "human.csv"
    argv = ["lvlm", "human-labels", "--answers", *files, "--key"]
    argv += [str(form / "story" / "key.parquet"), str(form / "term" / "key.parquet")]
    argv += ["--template", str(form / FILES["template"]), "--out", str(human)]
    assert main(argv) == 0
    argv = ["lvlm", "correct", "--responses", str(run / "responses.parquet"), "--human"]
    argv += [str(human), "--out", str(tmp_path / "out")]
    argv += ["--preset", '{"reader_correction": {"replicates": 20}, "metrics": {"min_count": 1}}']
    assert main(argv) == 0
    table = pl.read_parquet(tmp_path / "out" / "corrected.parquet")
    assert table.height == 2
    assert table["corrected"].to_numpy() == pytest.approx(table["naive"].to_numpy())
    # a pilot: these human labels agree everywhere, so every stratum's rate is 0 and the
    # draw falls to the floor of 2 per stratum (the term stratum: still all 3, unreachable)
    argv = ["lvlm", "reader-sample", "--responses", str(run / "responses.parquet")]
    argv += ["--out", str(tmp_path / "pilot"), "--preset", preset, "--pilot-human", str(human)]
    assert main(argv) == 0
    design = pl.read_parquet(tmp_path / "pilot" / FILES["design"]).sort("stratum")
    assert design["disagreement"].to_list() == [0.0, 0.0, 0.0]
    assert design["n_human"].to_list() == [2, 2, 3]


# ---------------------------------------------------------------- the planner


def test_plan_sizes_stories_and_term_pairs(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)
    config, _ = load_config("config/config.yaml")
    lv = config["lvlm"]
    section = lv["reader_sample"]
    assert section["disagreement"] == {"story": 0.14, "term": 0.03}
    strata = plan_strata(config)
    n_story = lv["tasks"]["story"]["images_per_group"]
    per = strata.group_by("model").agg(pl.col("n_items").sum(), pl.len().alias("strata"))
    story_rows = per.filter(pl.col("model").str.ends_with("|story"))
    # story: a stratum per setting x axis x group (gender 2 + race 7), images_per_group each
    assert (story_rows["strata"] == 9 * len(lv["settings"])).all()
    assert (story_rows["n_items"] == 9 * len(lv["settings"]) * n_story).all()
    part = labels_needed(config, None)
    assert part["benchmark"] == "lvlm" and len(part["rows"]) == 2 * len(lv["models"])
    for r in part["rows"]:
        rate = 0.14 if ", story" in r["model"] else 0.03
        assert r["disagreement_min"] == rate and r["width"] <= 0.05 and r["reachable"]
        room = (0.05 / (2 * Z)) ** 2 - 0.25 / r["n_items"]
        # equal rates: n = rate / room, each stratum rounded up, at least 2 per stratum
        assert max(rate / room, r["floor"]) <= r["n_human"] < rate / room + r["strata"] + r["floor"]
    story_part = [r for r in part["rows"] if ", story" in r["model"]][0]
    assert story_part["n_human"] == 1314  # 0.14 / room at N = 4,500, 9 strata rounded up
    # term: the items are judged pairs, a stratum per axis x term (gender, race), and a
    # round of images_per_group is 1 pair (gender) or 21 (race): 120 terms x 100 x 22
    assert lv["axes"] == ["gender", "race"]
    term_rows = per.filter(pl.col("model").str.ends_with("|term"))
    n_term = lv["tasks"]["term"]["images_per_group"]
    assert (term_rows["n_items"] == term_rows["strata"] // 2 * n_term * (1 + 21)).all()
    term_part = [r for r in part["rows"] if ", term" in r["model"]][0]
    assert term_part["model"].endswith("term (term pairs)")
    assert (term_part["n_items"], term_part["strata"]) == (264_000, 240)
    # the floor of 2 per stratum decides: 480 pairs to read, width 0.042
    assert term_part["n_human"] == term_part["floor"] == 480
    assert term_part["width"] == pytest.approx(0.0421, abs=5e-5)
    # printed intervals (reader_correction.MIN_HUMAN_RELIABLE a cell): 500 stories a cell
    # reach 400 (9 x 400); 120 gender term cells of 100 pairs never do (100 x 400 / 100 =
    # 400 rounds a group would), the 120 race ones of 2,100 take 400 each
    assert rc.MIN_HUMAN_RELIABLE == 400
    assert (story_part["n_printable"], story_part["n_recommended"]) == (9 * 400, 9 * 400)
    assert story_part["cells_short"] == 0 and story_part["knob_needed"] is None
    assert term_part["n_printable"] == 120 * 100 + 120 * 400
    assert (term_part["cells_short"], term_part["short_items_min"]) == (120, 100)
    assert term_part["n_recommended"] == 120 * 2 + 120 * 400
    assert term_part["knob"] == "lvlm.tasks.term.images_per_group"
    assert term_part["knob_needed"] == 400


def test_plan_reads_a_pilot(repo_root, monkeypatch, tmp_path):
    """`stereolens plan --pilot DIR`: the pilot's reader tables and its (here SIMULATED)
    human labels give the rates; the config's models are not the pilot's, so each task's
    rate is the pilot's over that task, the worst attribute's."""
    monkeypatch.chdir(repo_root)
    responses, story, term = lvlm_tables()
    (tmp_path / "lvlm").mkdir()
    for name, frame in (("responses", responses), ("story_attributes", story),
                        ("term_judgements", term)):  # fmt: skip
        frame.write_parquet(tmp_path / "lvlm" / f"{name}.parquet")
    config, _ = load_config("config/config.yaml")
    no_labels = labels_needed(config, tmp_path)
    assert no_labels["disagreement_source"] == "default"
    assert "no human labels" in " ".join(no_labels["notes"])
    reader = pl.concat(
        [story_reader(story, responses).select(*hl.READER_COLUMNS),
         term_reader(term).select(*hl.READER_COLUMNS)]
    )  # fmt: skip
    # every item labelled; 3 of the 12 stories' occupations and 1 of the 3 rounds differ
    flip = ["m/image/gender/f1/p1", "m/image/gender/m2/p1", "m/image/gender/m4/p1",
            "m/image/gender/t1/1/male/female"]  # fmt: skip
    human = reader.with_columns(
        pl.when(pl.col("item_id").is_in(flip) & pl.col("attribute").is_in(["occupation", "winner"]))
        .then(pl.when(pl.col("label") == "male").then(pl.lit("female")).otherwise(pl.lit("pilot")))
        .otherwise("label")
        .alias("label"),
        pl.lit(1.0).alias("selection_probability"),
        pl.lit(True).alias("simulated"),
    )  # fmt: skip
    assert (human["label"] != reader["label"]).sum() == 4
    human.write_parquet(tmp_path / "lvlm" / "human_labels_simulated.parquet")
    part = labels_needed(config, tmp_path)
    assert part["disagreement_source"].startswith("pilot")
    assert "SIMULATED" in " ".join(part["notes"])
    for r in part["rows"]:
        rate = 0.25 if ", story" in r["model"] else 1 / 3  # occupation 3/12; pairs 1/3
        assert r["disagreement_min"] == r["disagreement_max"] == pytest.approx(rate)
        room = (0.05 / (2 * Z)) ** 2 - 0.25 / r["n_items"]
        assert max(rate / room, r["floor"]) <= r["n_human"] < rate / room + r["strata"] + r["floor"]


# ---------------------------------------------------------------- the race axis

RACES = ("Black", "East Asian", "Indian", "White", "Latino_Hispanic", "Middle Eastern",
         "Southeast Asian")  # fmt: skip


def race_tables():
    """responses and term_judgements of one race term: 2 rounds of the 21 pairs of 7 groups;
    in every pair the group earlier in RACES wins (a round's wins 6, 5, ..., 0), but round
    1's pair (Middle Eastern, Southeast Asian) is undecided; A/B alternate."""
    keys = {"model": "m", "setting": "image", "axis": "race", "prompt_id": "t1"}
    judged, rows = [], []
    for k in range(2):
        for g in RACES:
            rows.append({**keys, "task": "term", "group": g, "image_id": f"{g}{k}",
                         "response": f"explanation {k} by {g}"})  # fmt: skip
        for i in range(7):
            for j in range(i + 1, 7):
                a, b = (RACES[i], RACES[j]) if (i + j + k) % 2 == 0 else (RACES[j], RACES[i])
                undecided = k == 1 and (i, j) == (5, 6)
                judged.append({**keys, "pair_index": k, "group_a": a, "group_b": b,
                               "image_id_a": f"{a}{k}", "image_id_b": f"{b}{k}",
                               "term": "Entropy", "domain": "physics",
                               "winner": None if undecided else RACES[i]})  # fmt: skip
    return pl.DataFrame(rows), pl.DataFrame(judged, schema_overrides={"winner": pl.String})


def test_race_term_items_are_judged_pairs_by_hand(tmp_path):
    """Issue 21: a race round (21 pairs among 7 groups) is 21 items, not one whose labels
    repeat a group (the reader table refused it: 'repeats label'). By hand: the judge's
    wins (12, 10, 8, 6, 4, 1, 0) of the 41 pairs decided, appearances (12 x 5, 11, 11) of
    82; TVD = 1/2 sum |2 wins - apps| / 82 = 48 / 164 = 12/41 -> 29.27 = lvlm.scores' own
    plug-in. A sample of 10 pairs whose humans agree: corrected == naive; every pair
    labelled with (Black, Southeast Asian) of round 0 given to Southeast Asian: wins (11,
    10, 8, 6, 4, 1, 1), TVD 44 / 164 = 11/41 -> 26.83."""
    from stereolens.cli import main
    from stereolens.lvlm.scores import overall_scores

    responses, term = race_tables()
    tr = term_reader(term)
    assert tr.height == 42 and tr["item_id"].n_unique() == 42
    assert tr["stratum"].unique().to_list() == ["m|image|race|t1"]
    # A then B as the judge saw them: East Asian was shown first in round 0
    assert "m/image/race/t1/0/East Asian/Black" in tr["item_id"].to_list()
    ref = overall_scores("term", term, n_boot=0, permutations=0)
    assert ref["score"][0] == pytest.approx(1200 / 41)
    # humans agree on a simple random sample of 10 of the 42 pairs
    sample = tr.sample(10, seed=1).select(*hl.READER_COLUMNS)
    agree = sample.with_columns(selection_probability=pl.lit(10 / 42))
    table, left_out = corrected_scores(None, tr, agree, replicates=50)
    assert left_out.height == 0 and table.height == 1
    row = table.row(0, named=True)
    assert row["naive"] == pytest.approx(1200 / 41)
    assert row["corrected"] == pytest.approx(row["naive"])
    assert (row["n_human"], row["n_items"]) == (10, 42)
    # seven groups: the double bootstrap's interval (bc centre, the once-corrected
    # replicates' sd; covered 93.5% where bc-normal covered 91.4%), held by the size rule
    # alone (10 < 400 labels), withheld at no size
    assert row["interval_reliable"] is False and row["withheld_reason"] is None
    two, seven = term_estimator(2), term_estimator(7)
    assert two is rc.corrected_metric
    assert seven.func is rd.corrected_metric_double and seven.keywords == {"centre": "once"}
    assert row["ci_low"] < row["estimate_bc"] < row["ci_high"]
    assert row["ci_high"] - row["estimate_bc"] == pytest.approx(row["estimate_bc"] - row["ci_low"])
    # every pair labelled, one human disagreement: the humans' own score
    flip, sea = "m/image/race/t1/0/Black/Southeast Asian", "Southeast Asian"
    assert flip in tr["item_id"].to_list()
    every = tr.select(*hl.READER_COLUMNS).with_columns(
        selection_probability=pl.lit(1.0),
        label=pl.when(pl.col("item_id") == flip).then(pl.lit(sea)).otherwise("label"),
    )
    table, _ = corrected_scores(None, tr, every, replicates=50)
    assert table["naive"].item() == pytest.approx(1200 / 41)
    assert table["corrected"].item() == pytest.approx(1100 / 41)
    # the CLI: `stereolens lvlm correct` on the run's tables and the agreeing sample
    run = tmp_path / "run"
    run.mkdir()
    responses.write_parquet(run / "responses.parquet")
    term.write_parquet(run / "term_judgements.parquet")
    human = tmp_path / "human.csv"
    agree.write_csv(human)
    argv = ["lvlm", "correct", "--responses", str(run / "responses.parquet"), "--human"]
    argv += [str(human), "--out", str(tmp_path / "out")]
    argv += ["--preset", '{"reader_correction": {"replicates": 20}}']
    assert main(argv) == 0
    out = pl.read_parquet(tmp_path / "out" / "corrected.parquet")
    assert out.select("axis", "metric").rows() == [("race", "term")]
    assert out["naive"].item() == pytest.approx(1200 / 41)
    assert out["corrected"].item() == pytest.approx(1200 / 41)


def test_race_term_sample_is_drawn_by_pair(tmp_path):
    """The human sample of a race term draws judged pairs (42 items in the one stratum),
    the term form shows one drawn pair per set, `lvlm human-labels` writes one label per
    pair, and humans who agree with the judge leave the score: corrected == naive =
    1200/41."""
    responses, term = race_tables()
    paths = export_reader_sample(
        responses, None, term, tmp_path, target_width=0.4, disagreement={"term": 0.03}, seed=2
    )
    design = pl.read_parquet(paths["design"])
    assert design.select("task", "stratum", "n_items").rows() == [("term", "m|image|race|t1", 42)]
    n = design["n_human"].item()
    # one stratum: n = rate / room, rounded up, room = (0.4 / 2z)^2 - 0.25 / 42 pairs: 7
    assert n == math.ceil(0.03 / ((0.4 / (2 * Z)) ** 2 - 0.25 / 42)) == 7
    assert design["selection_probability"].item() == pytest.approx(7 / 42)
    key = pl.read_parquet(paths["term_key"])
    template = hl.read_human_labels(paths["template"])
    assert key.height == n and key["item_id"].n_unique() == n
    assert sorted(template["item_id"]) == sorted(key["item_id"])
    assert (key["image_ids"].list.len() == 2).all()
    winner = dict(term_reader(term).select("item_id", "label").iter_rows())

    def answer(row, dim):
        got = winner[row["item_id"]]
        return "cannot tell" if got == "unknown" else "A" if got == row["group_a"] else "B"

    files = [write_answers(tmp_path / "term.csv", key, answer)]
    human = human_labels_from_answers(files, [paths["term_key"]], paths["template"])
    assert human.height == n and human["item_id"].n_unique() == n
    assert dict(human.select("item_id", "label").iter_rows()) == {
        i: winner[i] for i in key["item_id"]
    }
    table, _ = corrected_scores(None, term_reader(term), human, replicates=50)
    assert table["naive"].item() == pytest.approx(1200 / 41)
    assert table["corrected"].item() == pytest.approx(1200 / 41)


def test_a_round_item_id_is_refused_by_name():
    """A human-label table keyed by rounds (the term item before issue 21) is refused with
    the pair's item id, not read as labels of unknown items."""
    _, term = race_tables()
    tr = term_reader(term)
    human = pl.DataFrame(
        {"item_id": ["m/image/race/t1/0"] * 2, "attribute": "winner", "label": "Black",
         "stratum": "m|image|race|t1", "selection_probability": 1.0}
    ).with_columns(label=pl.Series(["Black", "White"]))  # fmt: skip
    with pytest.raises(ValueError, match=r"names a round; a term item is one judged pair"):
        corrected_scores(None, tr, human, replicates=5)


def test_term_bootstrap_resamples_rounds_as_the_scores_do():
    """The round is a term item's cluster (its 21 pairs share the round's 7 explanations),
    so corrected.parquet's bootstrap resamples rounds, as lvlm.scores does. The race world
    of docs/statistics.md (bench/cover/_lvlm_reader.py: 10 terms x 30 rounds, each
    explanation a quality shared by its 6 pairs, the better one winning, the judge right; 100
    pairs per term labelled): over seeds 0-5 the naive interval (a race row: bc centre, the
    double bootstrap's error) is 1.01 as wide as scores.parquet's (0.91 with pairs resampled
    one by one, the bootstrap before), and the plug-in the same. With the bc-normal interval
    before it the ratios were 0.89 and 0.82; against the score's own sampling sd (2,000
    datasets: 2 x 1.96 x 0.593 = 2.33) its widths over 20 seeds were 0.96 (rounds), 0.90
    (pairs), 1.05 (scores)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from cover._lvlm_reader import race_judgements

    from stereolens.lvlm.scores import overall_scores

    _, term = race_tables()
    tr = term_reader(term)
    assert tr["cluster"].unique().sort().to_list() == ["m/image/race/t1/0", "m/image/race/t1/1"]
    ratio = {"rounds": [], "pairs": []}
    for seed in range(6):
        term, reader, human = race_judgements(seed)
        ref = overall_scores("term", term, n_boot=1000, permutations=0).row(0, named=True)
        for how, table in (("rounds", reader), ("pairs", reader.drop("cluster"))):
            row = corrected_scores(None, table, human, replicates=1000)[0].row(0, named=True)
            assert row["naive"] == pytest.approx(ref["score"])
            width = row["naive_high"] - row["naive_low"]
            ratio[how].append(width / (ref["ci_high"] - ref["ci_low"]))
    rounds, pairs = (float(sum(v) / len(v)) for v in ratio.values())
    assert 0.9 < rounds < 1.1
    assert pairs < 0.95 and rounds > pairs + 0.05


def test_export_rule_is_opt_in(tmp_path, repo_root):
    """lvlm.reader_sample.export (off by default) adds rule export_lvlm_reader_sample to the
    demo's dry run, its files among the targets (a form and key per task the config runs);
    the rule's command, with the --preset the rule passes, writes exactly those files."""
    import subprocess
    import sys
    from pathlib import Path

    import yaml
    from conftest import workflow_env

    from stereolens.cli import main
    from stereolens.lvlm.params import prompt_file
    from stereolens.lvlm.plugin import _targets, reader_sample_files
    from stereolens.settings import settings_json

    snakemake = str(Path(sys.executable).parent / "snakemake")

    def demo(export: bool | None) -> Path:
        config = yaml.safe_load((repo_root / "config" / "demo.yaml").read_text())
        config["registry"] = str(repo_root / "config" / "models.yaml")
        if export is not None:
            config["lvlm"].setdefault("reader_sample", {})["export"] = export
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def dry_run(export: bool | None) -> str:
        run = subprocess.run(
            [snakemake, "-n", "--quiet", "rules", "--configfile", str(demo(export))],
            cwd=repo_root, env=workflow_env(), capture_output=True, text=True,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout

    assert "export_lvlm_reader_sample" not in dry_run(None)
    assert "export_lvlm_reader_sample" in dry_run(True)
    config, _ = load_config(demo(True))
    folder = "results/lvlm/reader_sample"
    files = [f"{folder}/{n}" for n in ("story/form.html", "story/key.parquet")]
    files += [f"{folder}/{n}" for n in ("term/form.html", "term/key.parquet")]
    files += [f"{folder}/{n}" for n in ("human_labels_template.csv", "design.parquet")]
    assert list(reader_sample_files(config["lvlm"]).values()) == files
    assert [t for t in _targets(config) if "reader_sample" in t] == files
    only_story = {**config["lvlm"], "tasks": {"story": config["lvlm"]["tasks"]["story"]}}
    assert list(reader_sample_files(only_story)) == [
        "story_form",
        "story_key",
        "template",
        "design",
    ]
    # the rule's command on a run's tables: the files it declares, nothing else
    responses, story, term = lvlm_tables()
    run = tmp_path / "run"
    run.mkdir()
    responses.write_parquet(run / "responses.parquet")
    story.write_parquet(run / "story_attributes.parquet")
    term.write_parquet(run / "term_judgements.parquet")
    out = tmp_path / folder
    preset = settings_json(config["lvlm"], ("reader_sample",))
    assert json.loads(preset)["reader_sample"]["export"] is True
    argv = ["lvlm", "reader-sample", "--responses", str(run / "responses.parquet")]
    argv += ["--prompts", prompt_file(config["lvlm"]), "--preset", preset, "--out", str(out)]
    assert main(argv) == 0
    written = sorted(str(p.relative_to(tmp_path)) for p in out.rglob("*") if p.is_file())
    assert written == sorted(files)
    design = pl.read_parquet(out / "design.parquet")
    assert set(design["task"]) == {"story", "term"} and design["n_human"].min() >= 2
