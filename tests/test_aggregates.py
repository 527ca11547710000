"""The aggregate stages (issue "Performance at both ends"): the streamed, per-model merges,
the resampler of the BiasIG bootstrap, the reduced LVLM metrics and the partitioned
canonicalisation give the tables of the earlier in-memory code.

The earlier code is kept as reference functions: the BiasIG ones in
tests/reference_aggregates.py (merge_answers, image_table, bootstrap_blocks, bootstrap),
the ContextBias and LVLM ones in tests/reference_aggregates_cb_lvlm.py
(merge_extractions_reference: the ContextBias extraction merge; merge_tables: the LVLM
merge; compute_all_reference: the LVLM metrics). They run here on a small
synthetic run (bench/synthetic.py with tests/data/aggregates/run.yaml: three BiasIG
generators with a debiasing variant and two-person prompts, two extractors x two generators
x three roles, two audited LVLMs on all four tasks) and, in test_workflow.py, on the demo's
own shard files. Tolerance: float rounding (sums taken in another order), 1e-12 relative.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from stereolens.atomic import read_jsonl, write_jsonl
from stereolens.biasig import answers as BA
from stereolens.biasig import merge as BM
from stereolens.biasig import metrics as BMet
from stereolens.biasig import resample as BR
from stereolens.biasig.groups import Explicit
from stereolens.contextbias import merge as CM
from stereolens.contextbias.canonical import canonicalise_attributes, write_canonical_attributes
from stereolens.contextbias.schema import AttributeSchema
from stereolens.lvlm import merge as LM
from stereolens.lvlm import metrics as LMet
from stereolens.models.registry import load_registry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import reference_aggregates as RA  # noqa: E402
import reference_aggregates_cb_lvlm as REF  # noqa: E402
import synthetic  # noqa: E402

from stereolens.lvlm.settings import LVLMSettings  # noqa: E402

STORY_SKEW_KEYS = ["model", "setting", "axis", "attribute", "value", "group"]


def same(new: pl.DataFrame, old: pl.DataFrame, what: str = "") -> None:
    """Equal up to float rounding; an all-null column of the reference (dtype Null, inferred
    from the records) may be typed in the new table."""
    old = old.with_columns(
        pl.col(c).cast(new.schema[c]) for c in old.columns if old[c].dtype == pl.Null
    )
    new = new.drop([c for c in REF.ADDED_COLUMNS if c in new.columns and c not in old.columns])
    assert_frame_equal(new, old, check_exact=False, rel_tol=1e-12, abs_tol=1e-13), what


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The synthetic run's shard files (written by the project's record builders)."""
    out = tmp_path_factory.mktemp("aggregates")
    synthetic.generate(
        out, synthetic.scale_fraction(1), log=lambda _m: None,
        config_path=ROOT / "tests/data/aggregates/run.yaml", workers=1,
    )  # fmt: skip
    return out / "results"


@pytest.fixture(scope="module")
def registry():
    return load_registry(ROOT / "config/models.yaml")


def _files(base: Path, pattern: str) -> list[str]:
    return sorted(str(p) for p in base.glob(pattern))


# ---------------------------------------------------------------- merges
@pytest.fixture(scope="module")
def answers(run, registry, tmp_path_factory) -> pl.DataFrame:
    out = tmp_path_factory.mktemp("answers")
    models = sorted(p.name for p in (run / "biasig/vqa/internvl-4b-bench").iterdir())
    assert len(models) == 3  # two models and a debiasing variant of one of them
    for m in models:
        BM.merge_model_answers(_files(run, f"biasig/vqa/*/{m}/*/*/*.jsonl"), out / m, registry)
    BM.merge_answer_parts([out / m for m in reversed(models)], out / "answers.parquet")
    return pl.read_parquet(out / "answers.parquet")


def test_biasig_merge_gives_the_earlier_table(run, registry, answers):
    old = RA.biasig_merge_answers_reference(_files(run, "biasig/vqa/*/*/*/*/*.jsonl"), registry)
    same(answers, old)
    assert answers.columns == BM.COLUMNS
    assert {"left", "right", "single"} <= set(answers["position"])
    assert {"ok", "partial", "discarded"} <= set(answers["status"])
    assert set(answers.filter(pl.col("variant") == "sdxl-intervention")["model"]) == {"sdxl"}


def test_contextbias_merge_gives_the_earlier_tables(run, tmp_path):
    schema = AttributeSchema.load()
    parts = []
    for folder in sorted((run / "contextbias/extractions").glob("*/*")):
        a = tmp_path / f"{folder.parent.name}_{folder.name}_attributes.parquet"
        i = tmp_path / f"{folder.parent.name}_{folder.name}_images.parquet"
        CM.merge_extraction_part(_files(folder, "*/*/*.jsonl"), schema, a, i)
        parts.append((a, i))
    assert len(parts) == 4
    parts.reverse()  # the parts are ordered by their content, not by the list
    counts = CM.merge_extraction_parts(
        [a for a, _ in parts], [i for _, i in parts], tmp_path / "attrs", tmp_path / "images"
    )
    old_attrs, old_images = REF.merge_extractions_reference(
        _files(run, "contextbias/extractions/*/*/*/*/*.jsonl"), schema
    )
    same(pl.read_parquet(tmp_path / "attrs"), old_attrs)
    same(pl.read_parquet(tmp_path / "images"), old_images)
    assert counts["labels"] == old_attrs.height and counts["discarded"] > 0
    # the in-memory function gives the same tables
    attrs, images = CM.merge_extractions(
        _files(run, "contextbias/extractions/*/*/*/*/*.jsonl"), schema
    )
    same(attrs, old_attrs)
    same(images, old_images)
    # canonicalisation part by part gives the whole table's
    mapping = pl.DataFrame(
        {"dimension": ["items"], "raw_label": [old_attrs.filter(pl.col("dimension") == "items")[
            "label"][0]], "core_label": ["canonical item"]}
    )  # fmt: skip
    write_canonical_attributes(pl.scan_parquet(tmp_path / "attrs"), mapping, tmp_path / "canon")
    same(pl.read_parquet(tmp_path / "canon"), canonicalise_attributes(old_attrs, mapping))


def _lvlm_inputs(run: Path, models: list[str]) -> dict[str, list[str]]:
    patterns = {
        "response_paths": "lvlm/responses/{m}/*/*/*/*/*.jsonl",
        "refusal_paths": "lvlm/refusals/{m}/*.parquet",
        "story_paths": "lvlm/story_attributes/{m}/*/*.jsonl",
        "judgement_paths": "lvlm/term_judgements/{m}/*/*.parquet",
    }
    return {
        key: [p for m in models for p in _files(run, pattern.format(m=m))]
        for key, pattern in patterns.items()
    }


@pytest.fixture(scope="module")
def lvlm_tables(run, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("lvlm")
    models = sorted(p.name for p in (run / "lvlm/responses").iterdir())
    assert len(models) == 2
    parts = {}
    for m in models:
        parts[m] = {n: out / f"{m}_{n}.parquet" for n in LM.TABLES}
        LM.merge_model_tables(**_lvlm_inputs(run, [m]), out=parts[m])
    final = {n: out / f"{n}.parquet" for n in LM.TABLES}
    LM.merge_model_parts(parts, final)
    return final


def test_lvlm_merge_gives_the_earlier_tables(run, lvlm_tables):
    models = sorted(p.name for p in (run / "lvlm/responses").iterdir())
    inputs = _lvlm_inputs(run, models)
    old = REF.merge_tables(
        [r for p in inputs["response_paths"] for r in read_jsonl(p)],
        [pl.read_parquet(p) for p in inputs["refusal_paths"]],
        [r for p in inputs["story_paths"] for r in read_jsonl(p)],
        [pl.read_parquet(p) for p in inputs["judgement_paths"]],
    )
    for name in LM.TABLES:
        same(pl.read_parquet(lvlm_tables[name]), old[name], name)
    responses = pl.read_parquet(lvlm_tables["responses"])
    assert set(responses["task"]) == {"story", "term", "exam", "attribute_inferring"}
    assert {"request", "response", "refusal"} <= set(responses.columns)


def test_a_record_key_the_schema_lacks_fails(run, registry, tmp_path):
    rows = read_jsonl(_files(run, "biasig/vqa/*/*/*/*/*.jsonl")[0])
    path = tmp_path / "shard.jsonl"
    write_jsonl(path, [{**rows[0], "new_field": 1}])
    with pytest.raises(ValueError, match="new_field.*ANSWER_DTYPES"):
        BM.merge_model_answers([path], tmp_path / "out.parquet", registry)
    path.write_text(json.dumps(rows[0]) + "\n" + '{"model": ')
    with pytest.raises(ValueError, match="shard.jsonl:2"):
        BM.merge_model_answers([path], tmp_path / "out.parquet", registry)
    assert not (tmp_path / "out.parquet").exists()


# ---------------------------------------------------------------- metrics
def test_resampler_counts_are_the_reference_draws(answers, run):
    prompts = pl.read_parquet(run / "biasig/prompts.parquet")
    prep = BA.prepare_answers(answers, prompts)
    exp = Explicit(prep)
    resampler = BR.Resampler(prep, 50, exp)
    full, asked = {}, {}
    for c0, c1, counts, ask in resampler.chunks(7, units_per_chunk=5):
        for u in range(c0, c1):
            (asked if exp.mask[u] else full)[u] = (ask if exp.mask[u] else counts)[u - c0].copy()
    n = 0
    for u0, u1, counts in RA.biasig_bootstrap_blocks_reference(prep, 50, 7):
        for u in range(u0, u1):
            if exp.mask[u]:
                expected = exp.person_accuracy(counts[u - u0][None], np.array([u]))
                got = exp.person_accuracy_asked(asked[u][None], np.array([u]))
                assert np.array_equal(got, expected, equal_nan=True)
            else:
                assert np.array_equal(full[u], counts[u - u0])
            n += 1
    assert n == prep.units.height


def test_biasig_metrics_give_the_earlier_tables(answers, run, monkeypatch):
    prompts = pl.read_parquet(run / "biasig/prompts.parquet")
    new = BMet.compute_metrics(answers, prompts, replicates=120, ceiling_draws=20, threads=2)
    one = BMet.compute_metrics(answers, prompts, replicates=120, ceiling_draws=20, threads=1)
    # patched where they are looked up at call time: compute_metrics calls metrics._bootstrap,
    # prepare_answers calls answers._image_table (the calls are counted: a patch in the wrong
    # module would compare the new code with itself)
    calls = RA.biasig_patch_references(monkeypatch.setattr)
    old = BMet.compute_metrics(answers, prompts, replicates=120, ceiling_draws=20)
    assert calls == {"bootstrap": 1, "image_table": 1}
    for name in ("implicit", "explicit", "eta"):
        assert new[name].equals(one[name]), name  # threads change nothing
        same(new[name], old[name], name)
    assert new["implicit"]["ci_low"].is_not_null().any()


def test_lvlm_metrics_give_the_earlier_tables(lvlm_tables):
    story = pl.read_parquet(lvlm_tables["story_attributes"])
    terms = pl.read_parquet(lvlm_tables["term_judgements"])
    kw = {"min_count": 2, "replicates": 60, "permutations": 60}
    # as the CLI reads it: a lazy scan, of which only the metrics' columns are read
    new = LMet.compute_all(
        pl.scan_parquet(lvlm_tables["responses"]),
        story,
        terms,
        replace(LVLMSettings.preset(), **kw),
    )
    old = REF.compute_all_reference(pl.read_parquet(lvlm_tables["responses"]), story, terms, **kw)
    for name in ("scores", "prompt_scores", "refusals", "exam_accuracy", "story_skew"):
        a, b = new[name], old[name]
        if name == "story_skew":  # sorted by tvd first: ties may fall either way
            a, b = a.sort(STORY_SKEW_KEYS), b.sort(STORY_SKEW_KEYS)
        same(a, b, name)
    assert {(t, a) for t, a in new["scores"].select("task", "axis").iter_rows()} == {
        (t, a) for t in ("story", "term", "exam") for a in ("gender", "race")
    }
