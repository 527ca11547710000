"""ContextBias human annotation study: blinded form export, answer validation, consensus,
Cohen's and Fleiss' kappa, consensus vs pipeline (paper Sec. 4.3, App. D.2)."""

import base64
import csv
import importlib.util
import re
import shutil
import subprocess

import numpy as np
import polars as pl
import pytest
from conftest import skip_unless_ci

from stereolens.annotation_form import CSV_COLUMNS
from stereolens.contextbias.annotation.answers import read_answers
from stereolens.contextbias.annotation.columns import PAIR_COLUMNS, SUMMARY_COLUMNS
from stereolens.contextbias.annotation.form import export_annotation_sample
from stereolens.contextbias.annotation.kappa import (
    bootstrap_fleiss,
    cohen_kappa,
    fleiss_kappa,
    fleiss_kappa_weighted,
    fleiss_table,
)
from stereolens.contextbias.annotation.pipeline import pipeline_set_labels
from stereolens.contextbias.annotation.study import (
    agreement_report,
    human_consensus,
    write_agreement_tables,
)

needs_statsmodels = pytest.mark.skipif(
    importlib.util.find_spec("statsmodels") is None, reason="statsmodels is not installed"
)

ROLES = ("zookeeper", "beekeeper")
MODELS = ("fakegen-alpha", "fakegen-beta")
CONDITIONS = ("CF", "CA-R", "CA-U")
DIMS = ("gender_presentation", "eyewear_present", "clothing_garment")
PER_TRIPLET = 6
PER_SET = 4


def prompt_text(role, condition):
    return f"a photo of a {role} in a glasshouse" if condition != "CF" else f"a photo of a {role}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """72 8x8 PNGs (2 roles x 3 conditions x 2 models x 6), the images table (one failed
    image per triplet) and the attributes table. Every PNG carries its prompt and model as
    a text chunk, as generators do."""
    from PIL import Image, PngImagePlugin

    root = tmp_path_factory.mktemp("corpus")
    image_rows, attr_rows = [], []
    n = 0
    for role in ROLES:
        for cond in CONDITIONS:
            for model in MODELS:
                for k in range(PER_TRIPLET):
                    n += 1
                    image_id = f"img{n:03d}{role[:3]}"
                    path = root / f"{model}_{role}_{cond}_{k}.png"
                    meta = PngImagePlugin.PngInfo()
                    meta.add_text("parameters", f"{prompt_text(role, cond)}; model {model}")
                    shade = (n * 37) % 256
                    Image.new("RGB", (8, 8), (shade, 255 - shade, k * 40)).save(path, pnginfo=meta)
                    status = "failed" if k == PER_TRIPLET - 1 else "ok"
                    image_rows.append(
                        {
                            "extractor": "vlm-x",
                            "model": model,
                            "role": role,
                            "condition": cond,
                            "prompt_id": f"{role}-{cond}-p1",
                            "seed": k,
                            "image_id": image_id,
                            "image_path": str(path),
                            "status": status,
                        }
                    )
                    if status != "ok":
                        continue
                    labels = {
                        "gender_presentation": "male" if role == "zookeeper" else "female",
                        "eyewear_present": "yes" if k % 2 else "no",
                        "clothing_garment": "overalls" if role == "zookeeper" else "veil",
                        "hair_color": "brown",
                    }
                    if k == 0 and role == "beekeeper":
                        del labels["gender_presentation"]  # not visible on this image
                    for dim, label in labels.items():
                        attr_rows.append(
                            {
                                "extractor": "vlm-x",
                                "model": model,
                                "role": role,
                                "condition": cond,
                                "image_id": image_id,
                                "cohort": "people",
                                "dimension": dim,
                                "label": label,
                            }
                        )
    return root, pl.DataFrame(image_rows), pl.DataFrame(attr_rows)


@pytest.fixture(scope="module")
def sample(corpus, tmp_path_factory):
    _, images, attributes = corpus
    out = tmp_path_factory.mktemp("sample")
    paths = export_annotation_sample(
        images, attributes, out, images_per_set=PER_SET, dimensions=DIMS, seed=7
    )
    return paths, pl.read_parquet(paths["key"])


def write_csv(path, rows, header=CSV_COLUMNS):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


# ---------------------------------------------------------------------------- kappa by hand
@needs_statsmodels
def test_fleiss_kappa_hand_worked():
    # 4 items, 3 raters, categories (a, b); counts per item:
    #   [3,0] [0,3] [2,1] [1,2]
    # P_i = (sum n_ij^2 - 3) / (3 * 2): 1, 1, (4+1-3)/6 = 1/3, 1/3  -> P = 8/3 / 4 = 2/3
    # p_a = p_b = 6/12 = 1/2 -> P_e = 1/2;  kappa = (2/3 - 1/2) / (1 - 1/2) = 1/3
    labels = np.array([["a", "a", "a"], ["b", "b", "b"], ["a", "b", "a"], ["b", "a", "b"]])
    counts = fleiss_table(labels)
    assert counts.tolist() == [[3, 0], [0, 3], [2, 1], [1, 2]]
    assert fleiss_kappa(counts) == pytest.approx(1 / 3)
    assert fleiss_kappa_weighted(counts, np.ones((1, 4)))[0] == pytest.approx(1 / 3)
    # a weighting is the same as repeating items
    repeated = counts[[0, 0, 2, 3]]
    assert fleiss_kappa_weighted(counts, [[2, 0, 1, 1]])[0] == pytest.approx(fleiss_kappa(repeated))
    # undefined with a single category
    assert fleiss_kappa(np.array([[3.0], [3.0]])) is None


@needs_statsmodels
def test_fleiss_kappa_classic_example():
    # The textbook example (Fleiss 1971 layout, 10 subjects, 14 raters, 5 categories):
    # P = 0.378, P_e = 0.213, kappa = 0.210.
    counts = np.array(
        [
            [0, 0, 0, 0, 14],
            [0, 2, 6, 4, 2],
            [0, 0, 3, 5, 6],
            [0, 3, 9, 2, 0],
            [2, 2, 8, 1, 1],
            [7, 7, 0, 0, 0],
            [3, 2, 6, 3, 0],
            [2, 5, 3, 2, 2],
            [6, 5, 2, 1, 0],
            [0, 2, 2, 3, 7],
        ]
    )
    assert fleiss_kappa(counts) == pytest.approx(0.210, abs=5e-4)
    assert fleiss_kappa_weighted(counts, np.ones((1, 10)))[0] == pytest.approx(fleiss_kappa(counts))


@needs_statsmodels
def test_fleiss_bootstrap_is_seeded_and_brackets_the_estimate():
    rng = np.random.default_rng(3)
    truth = rng.integers(0, 3, 200)
    labels = np.column_stack(
        [np.where(rng.random(200) < 0.85, truth, rng.integers(0, 3, 200)) for _ in range(3)]
    )
    counts = fleiss_table(labels)
    k = fleiss_kappa(counts)
    a = bootstrap_fleiss(counts, 500, np.random.default_rng(0))
    b = bootstrap_fleiss(counts, 500, np.random.default_rng(0))
    assert a == b and a[2] == 500
    assert a[0] < k < a[1] and a[1] - a[0] < 0.3


@needs_statsmodels
def test_cohen_kappa_hand_worked():
    # 50 items:        B yes  B no
    #          A yes     20     5      (A yes 25)
    #          A no      10    15      (B yes 30)
    # p_o = 35/50 = 0.7; p_e = .5*.6 + .5*.4 = 0.5; kappa = (0.7 - 0.5) / 0.5 = 0.4
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    agreement, kappa = cohen_kappa(a, b)
    assert agreement == pytest.approx(0.7)
    assert kappa == pytest.approx(0.4)
    assert cohen_kappa(["x", "x"], ["x", "x"]) == (1.0, None)  # chance agreement 1


# ---------------------------------------------------------------------------- consensus
def test_consensus_majority_then_slider_then_alphabet():
    rows = [
        # s1: 2 votes female beat 1 vote male with a high slider
        ("A", "s1", "female", 3.0),
        ("B", "s1", "female", 4.0),
        ("C", "s1", "male", 10.0),
        # s2: 1-1-1 tie, male has the highest slider
        ("A", "s2", "female", 5.0),
        ("B", "s2", "male", 8.0),
        ("C", "s2", "unknown", 2.0),
        # s3: 1-1-1 tie with equal sliders: alphabetical
        ("A", "s3", "male", 5.0),
        ("B", "s3", "female", 5.0),
        ("C", "s3", "nonbinary", 5.0),
    ]
    answers = pl.DataFrame(
        [
            {"annotator": a, "set_id": s, "dimension": "gender_presentation", "label": lab,
             "prevalence": p}
            for a, s, lab, p in rows
        ]
    )  # fmt: skip
    out = {r["set_id"]: r for r in human_consensus(answers).iter_rows(named=True)}
    assert (out["s1"]["consensus_label"], out["s1"]["tie_break"]) == ("female", "none")
    assert out["s1"]["consensus_prevalence"] == pytest.approx(3.5)
    assert out["s1"]["consensus_votes"] == 2
    assert (out["s2"]["consensus_label"], out["s2"]["tie_break"]) == ("male", "slider")
    assert (out["s3"]["consensus_label"], out["s3"]["tie_break"]) == ("female", "alphabetical")


# ---------------------------------------------------------------------------- export
def strip_data_urls(text):
    return re.sub(r"data:image/[a-z]+;base64,[A-Za-z0-9+/=]+", "", text)


def test_export_is_blinded_and_the_key_maps_back(corpus, sample):
    _, images, _ = corpus
    paths, key = sample
    text = paths["form"].read_text()
    visible = strip_data_urls(text)
    for secret in [*ROLES, *MODELS, "glasshouse", "a photo of", "key.parquet", "CA-R", "CA-U"]:
        assert secret not in visible, secret
    for image_id, path, prompt_id in images.select(
        "image_id", "image_path", "prompt_id"
    ).iter_rows():
        assert image_id not in visible and path not in visible and prompt_id not in visible
    # the inlined images are re-encoded: the prompt in the PNG text chunk is gone
    urls = re.findall(r"data:image/[a-z]+;base64,([A-Za-z0-9+/=]+)", text)
    assert len(urls) == key.height * PER_SET
    for u in urls:
        raw = base64.b64decode(u)
        assert b"zookeeper" not in raw and b"beekeeper" not in raw and b"fakegen" not in raw

    # one set per role x condition x model, shown in a random order under opaque ids
    assert key.height == len(ROLES) * len(CONDITIONS) * len(MODELS)
    shown = key.sort("position")
    triplets = list(zip(shown["role"], shown["condition"], shown["model"], strict=True))
    assert triplets != sorted(triplets)
    assert re.findall(r'data-set="([^"]+)" data-dimension="gender_presentation"', text) == (
        shown["set_id"].to_list()
    )
    assert all(re.fullmatch(r"[0-9a-f]{8}-\d{3}", s) for s in key["set_id"])
    # every question: a select for closed vocabularies, a text field for open ones
    assert text.count('class="item"') == key.height * len(DIMS)
    assert text.count('<select class="label">') == key.height * 2
    assert text.count('<input class="label" type="text"') == key.height
    assert text.count('value="unknown">unknown / not visible</option>') == key.height * 2
    assert text.count('type="range" min="0" max="4"') == key.height * len(DIMS)

    lookup = images.select("image_id", "role", "condition", "model", "status")
    for row in key.iter_rows(named=True):
        assert row["n_images"] == PER_SET == len(set(row["image_ids"]))
        got = lookup.filter(pl.col("image_id").is_in(row["image_ids"]))
        assert got.height == PER_SET
        assert set(got["role"]) == {row["role"]} and set(got["model"]) == {row["model"]}
        assert set(got["condition"]) == {row["condition"]} and set(got["status"]) == {"ok"}
        assert row["dimensions"] == list(DIMS)


def test_export_is_deterministic_with_the_seed(corpus, sample, tmp_path):
    _, images, attributes = corpus
    paths, key = sample
    again = export_annotation_sample(
        images, attributes, tmp_path / "a", images_per_set=PER_SET, dimensions=DIMS, seed=7
    )
    assert again["form"].read_bytes() == paths["form"].read_bytes()
    assert pl.read_parquet(again["key"]).equals(key)
    other = export_annotation_sample(
        images.reverse(), attributes, tmp_path / "b", images_per_set=PER_SET, dimensions=DIMS,
        seed=8,
    )  # fmt: skip
    other_key = pl.read_parquet(other["key"])
    assert other_key["set_id"][0] != key["set_id"][0]
    assert other_key["image_ids"].to_list() != key["image_ids"].to_list()


def test_export_refuses_short_sets_and_unknown_dimensions(corpus, tmp_path):
    _, images, attributes = corpus
    with pytest.raises(ValueError, match="fewer than 6 usable images"):
        export_annotation_sample(images, attributes, tmp_path, images_per_set=6)
    with pytest.raises(ValueError, match="not countable dimensions"):
        export_annotation_sample(images, attributes, tmp_path, dimensions=["shoe_size"])
    with pytest.raises(ValueError, match="no usable"):
        export_annotation_sample(images, attributes, tmp_path, roles=["astronaut"])
    paths = export_annotation_sample(
        images, attributes, tmp_path, roles=["beekeeper"], generators=["fakegen-beta"],
        images_per_set=6, dimensions=DIMS, allow_short=True,
    )  # fmt: skip
    key = pl.read_parquet(paths["key"])
    assert key.height == 3 and key["n_images"].to_list() == [5, 5, 5]


def test_form_javascript_writes_the_expected_csv(sample, tmp_path):
    paths, key = sample
    text = paths["form"].read_text()
    assert 'var CSV_HEADER = ["annotator", "set_id", "dimension", "label", "prevalence"];' in text
    assert "new Blob(" in text and "URL.createObjectURL" in text and ".download =" in text
    assert 'id="annotator"' in text and "Save answers" in text
    assert "fetch(" not in text and "XMLHttpRequest" not in text  # nothing leaves the machine
    node = shutil.which("node")
    if node is None:
        skip_unless_ci("node is not installed; the string checks above passed")
    script = re.search(r"<script>\n(/\* The CSV layout.*?)</script>", text, re.S).group(1)
    for n, block in enumerate(re.findall(r"<script>(.*?)</script>", text, re.S)):
        (tmp_path / f"block{n}.js").write_text(block)
        subprocess.run([node, "--check", str(tmp_path / f"block{n}.js")], check=True)
    sid = key["set_id"][0]
    program = script + (
        f'process.stdout.write(buildCsv([["Ann, B.", "{sid}", "clothing_garment", '
        f'"lab \\"white\\" coat", "3"], ["Ann, B.", "{sid}", "eyewear_present", "no", "4"]]));'
    )
    out = subprocess.run([node, "-e", program], capture_output=True, check=True).stdout
    assert out.startswith(b"annotator,set_id,dimension,label,prevalence\r\n")
    saved = tmp_path / "answers.csv"
    saved.write_bytes(out)
    answers = read_answers([saved], paths["key"])
    assert answers["annotator"].to_list() == ["Ann, B.", "Ann, B."]
    assert answers["label"].to_list() == ['lab "white" coat', "no"]
    assert answers["prevalence"].to_list() == [3.0, 4.0]


# ---------------------------------------------------------------------------- answers
def test_answer_validation_names_file_row_and_column(sample, tmp_path):
    paths, key = sample
    sid = key["set_id"][0]
    bad = write_csv(
        tmp_path / "bad.csv",
        [
            ("A", sid, "gender_presentation", "female", "3"),  # row 2: fine
            ("A", "nosuchset-001", "gender_presentation", "female", "3"),  # row 3
            ("A", sid, "eyewear_present", "maybe", "3"),  # row 4
            ("A", sid, "clothing_garment", "overalls", "11"),  # row 5
            ("", sid, "clothing_garment", "overalls", "2"),  # row 6
            ("A", sid, "gender_presentation", "male", "1"),  # row 7: answered twice
            ("A", sid, "hair_color", "brown", "1"),  # row 8: not asked
            ("A", sid, "eyewear_present", "yes", "lots"),  # row 9
        ],
    )
    with pytest.raises(ValueError) as err:
        read_answers([bad], paths["key"])
    msg = str(err.value)
    assert "7 problems" in msg
    assert f"{bad}, row 3, column 'set_id': unknown set id 'nosuchset-001'" in msg
    assert f"{bad}, row 4, column 'label': 'maybe' is not a eyewear_present label" in msg
    assert f"{bad}, row 5, column 'prevalence': 11 is outside 0-4" in msg
    assert f"{bad}, row 6, column 'annotator': empty" in msg
    assert f"{bad}, row 7, column 'set_id': A answered {sid}/gender_presentation before" in msg
    assert f"{bad}, row 8, column 'dimension'" in msg
    assert f"{bad}, row 9, column 'prevalence': 'lots' is not a number" in msg

    no_col = write_csv(tmp_path / "nocol.csv", [("A", sid, "x", "1")], CSV_COLUMNS[:-1])
    with pytest.raises(ValueError, match=r"nocol\.csv: missing columns \['prevalence'\]"):
        read_answers([no_col], paths["key"])

    lenient = write_csv(
        tmp_path / "ok.csv",
        [
            ("A", sid, "gender_presentation", " Female ", "3"),
            ("A", sid, "eyewear_present", "not visible", "0"),
            ("A", sid, "clothing_garment", "Lab  Coat", "2.5"),
        ],
    )
    got = read_answers([lenient], paths["key"])
    assert got["label"].to_list() == ["female", "unknown", "lab coat"]


# ---------------------------------------------------------------------------- pipeline
def test_pipeline_set_labels_majority_ties_and_unknown():
    key = pl.DataFrame(
        {
            "set_id": ["s1", "s2"],
            "n_images": [4, 2],
            "image_ids": [["i1", "i2", "i3", "i4"], ["j1", "j2"]],
            "dimensions": [["gender_presentation", "skin_tone"]] * 2,
        }
    )
    attributes = pl.DataFrame(
        {
            "image_id": ["i1", "i2", "i3", "i3", "i4", "j1", "j2", "j1"],
            "dimension": ["gender_presentation"] * 7 + ["skin_tone"],
            # i3 shows two people (male and female): counts once for each label
            "label": ["male", "female", "male", "female", "male", "male", "female", "dark"],
        }
    )
    out = {
        (r["set_id"], r["dimension"]): r
        for r in pipeline_set_labels(key, attributes).iter_rows(named=True)
    }
    s1 = out[("s1", "gender_presentation")]
    assert (s1["pipeline_label"], s1["pipeline_prevalence"], s1["pipeline_tie"]) == (
        "male",
        3,
        False,
    )
    s2 = out[("s2", "gender_presentation")]  # 1-1 tie: alphabetical
    assert (s2["pipeline_label"], s2["pipeline_prevalence"], s2["pipeline_tie"]) == (
        "female",
        1,
        True,
    )
    none = out[("s1", "skin_tone")]  # nothing visible: unknown on every image
    assert (none["pipeline_label"], none["pipeline_prevalence"], none["n_labelled"]) == (
        "unknown",
        4,
        0,
    )
    assert out[("s2", "skin_tone")]["pipeline_label"] == "dark"


# ---------------------------------------------------------------------------- report
@needs_statsmodels
def test_agreement_report_end_to_end(corpus, sample, tmp_path):
    _, _, attributes = corpus
    paths, key = sample
    pipe = pipeline_set_labels(key, attributes)
    truth = {(r["set_id"], r["dimension"]): r for r in pipe.iter_rows(named=True)}
    items = sorted(truth)
    files = []
    for name in ("ann1", "ann2", "ann3"):
        rows = []
        for n, (sid, dim) in enumerate(items):
            label = truth[(sid, dim)]["pipeline_label"]
            prev = truth[(sid, dim)]["pipeline_prevalence"]
            if name == "ann3" and n % 6 == 0:  # ann3 disagrees on every sixth item
                label = {"gender_presentation": "nonbinary", "eyewear_present": "unknown"}.get(
                    dim, "apron"
                )
            if name == "ann2" and n == 1:  # ann2 skipped one item
                continue
            rows.append((name, sid, dim, label, prev))
        files.append(write_csv(tmp_path / f"{name}.csv", rows))
    report = agreement_report(files, paths["key"], attributes, replicates=200, seed=0)
    summary = report["agreement_summary"]
    assert summary.columns == list(SUMMARY_COLUMNS)
    overall = summary.filter(pl.col("dimension") == "*").row(0, named=True)
    n_items = len(items)
    n_disagree = len(range(0, n_items, 6))
    assert overall["n_items"] == n_items and overall["n_complete"] == n_items - 1
    # item 1 (incomplete) is not one of ann3's disagreements
    assert overall["raw_agreement"] == pytest.approx((n_items - 1 - n_disagree) / (n_items - 1))
    assert overall["fleiss_ci_low"] <= overall["fleiss_kappa"] <= overall["fleiss_ci_high"]
    assert overall["valid_replicates"] == 200 and overall["extractor"] == "vlm-x"
    # the majority always sides with the pipeline
    assert overall["pipeline_agreement"] == 1.0 and overall["pipeline_kappa"] == 1.0
    assert overall["prevalence_mae"] == 0.0

    pairs = report["agreement_pairs"]
    assert pairs.columns == list(PAIR_COLUMNS)
    ab = pairs.filter(
        (pl.col("dimension") == "*") & (pl.col("rater_a") == "ann1") & (pl.col("rater_b") == "ann2")
    ).row(0, named=True)
    assert (ab["kind"], ab["n_items"], ab["agreement"], ab["kappa"]) == (
        "human-human",
        n_items - 1,
        1.0,
        1.0,
    )
    ac = pairs.filter(
        (pl.col("dimension") == "*") & (pl.col("rater_a") == "ann1") & (pl.col("rater_b") == "ann3")
    ).row(0, named=True)
    assert ac["agreement"] == pytest.approx((n_items - n_disagree) / n_items)
    assert set(pairs["kind"]) == {"human-human", "human-pipeline", "consensus-pipeline"}

    consensus = report["consensus_vs_pipeline"]
    assert consensus.height == n_items and consensus["match"].all()
    assert consensus.filter(~pl.col("complete")).height == 1
    assert set(consensus["role"]) == set(ROLES)

    written = write_agreement_tables(report, tmp_path / "tables")
    assert sorted(p.name for p in written.values()) == [
        "agreement_annotators.parquet",
        "agreement_pairs.parquet",
        "agreement_summary.parquet",
        "consensus_vs_pipeline.parquet",
    ]
    assert pl.read_parquet(written["agreement_summary"]).equals(summary)

    again = agreement_report(files, paths["key"], attributes, replicates=200, seed=0)
    assert again["agreement_summary"].equals(summary)
    with pytest.raises(ValueError, match="at least two annotators"):
        agreement_report(files[:1], paths["key"], attributes, replicates=10)
