"""Benchmark of the report at paper scale (issue 14: build < 60 s, index.html < 10 MB,
headless Chromium loads it < 3 s).

Builds a synthetic results folder shaped like config/config.yaml's run, with every paper
model of the three benchmarks:

* ContextBias: 92 roles x 3 conditions, 1,659 prompts x 10 seeds x 4 generators = 66,360
  images, 2 extractors (132,720 image rows, ~3 M attribute rows over the 29 counted
  dimensions of the shipped schema), BI / bootstrap / CCS / robustness / validation /
  canonicalisation tables of the real runs' shapes;
* BiasIG: the 47,040 shipped prompts x 10 images x 8 generators (4.3 M answer rows, two
  positions for the two-person prompts), S_imp / S_exp / eta at every level;
* LVLM: 9 models x (story 500, term 100, exam 100, attribute-inferring 100 user photos per
  group x 9 groups) = 5.9 M responses (term explanations and stories of realistic length,
  drawn from a pool of texts), the assistant's story attributes, the metric tables;
* job timings of 14,215 model jobs.

Image files: every ContextBias image, the user photos and the BiasIG images the galleries
draw exist as files (hard links to a pool of distinct PNGs at the generators' sizes:
1024 x 1024, FairFace 448 x 448). The tables record a distinct sha256 per image, so the
thumbnail cache sees every image as new and each thumbnail decodes a full-size PNG.

Times ``render_report`` with a cold thumbnail cache (first build) and a warm one (a
rebuild), the size of index.html and of the galleries, and the load of index.html in
headless Chromium (selenium; navigation timing, the load event; median of 3).

Run: .venv/bin/python bench/report_scale.py [--dir /tmp/stereolens-report-scale] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import yaml

REPO = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(14)
CONDITIONS = ["CF", "CA-R", "CA-U"]
TEXT_WORDS = (
    "the a of and to in is was she he they their work day city light small old new "
    "long quiet bright story people hands morning evening river house school market "
    "friend family coffee book music garden road window street office project"
).split()


def words(n: int) -> str:
    return " ".join(RNG.choice(TEXT_WORDS, size=n))


def pool(n: int, length: int) -> list[str]:
    return [words(length) for _ in range(n)]


def sha_like(prefix: str, n: int) -> pl.Series:
    return pl.Series([f"{prefix}{i:012x}" for i in range(n)])


def write(frame: pl.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(path)


def png_pool(folder: Path, n: int, size: int) -> list[Path]:
    """n distinct PNGs of size x size: smooth colour fields with noise, about the size a
    photo-like generated image compresses to."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    yy, xx = np.mgrid[0:size, 0:size] / size
    for k in range(n):
        base = np.stack(
            [np.sin(xx * (3 + k) + c) * 0.5 + 0.5 for c in (0.0, 1.0, 2.0)], axis=-1
        ) * (0.6 + 0.4 * yy[..., None])
        noise = RNG.normal(0, 0.04, base.shape)
        img = (np.clip(base + noise, 0, 1) * 255).astype(np.uint8)
        path = folder / f"pool{k}.png"
        Image.fromarray(img).save(path)
        out.append(path)
    return out


def link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists():
        os.link(src, dst)


# ------------------------------------------------------------------ ContextBias


def contextbias(res: Path, config: dict, images_pool: list[Path]) -> None:
    from stereolens.contextbias.schema import AttributeSchema

    cb = config["contextbias"]
    gens, exts = cb["generators"], cb["extractors"]
    roles = json.loads((REPO / "src/stereolens/resources/contextbias/roles.json").read_text())
    schema = AttributeSchema.load()
    vocab, cohort = schema.vocabulary(), schema.cohort_of()
    dims = sorted(vocab)
    labels = {d: list(v) if v else [f"{d}_{i}" for i in range(300)] for d, v in vocab.items()}
    # prompts: 1,659 over 92 roles x 3 conditions
    rows = []
    for i in range(1659):
        role = roles[i % len(roles)]
        cond = CONDITIONS[(i // len(roles)) % 3]
        text = f"a photo of a {role}, {words(12)}"
        rows.append({"prompt_id": f"p{i:06d}", "role": role, "condition": cond,
                     "variant": "phrasing", "text": text})  # fmt: skip
    prompts = pl.DataFrame(rows)
    write(prompts, res / "contextbias/prompts.parquet")
    seeds = pl.DataFrame({"seed": list(range(10))})
    imgs = (
        prompts.select("prompt_id", "role", "condition", "variant")
        .join(pl.DataFrame({"model": gens}), how="cross")
        .join(seeds, how="cross")
        .with_row_index("i")
        .with_columns(
            (pl.lit("i") + pl.col("i").cast(pl.String).str.zfill(15)).alias("image_id"),
        )
    )
    imgs = imgs.with_columns(
        pl.format("results/contextbias/images/{}/{}/{}/0/{}.png", "model", "role",
                  "condition", "image_id").alias("image_path"),
        pl.col("image_id").alias("image_sha256"),
    )  # fmt: skip
    n = imgs.height
    for k, (path,) in enumerate(imgs.select("image_path").iter_rows()):
        link(images_pool[k % len(images_pool)], res.parent / path)
    per_ext = []
    for e in exts:
        bad = RNG.random(n) < 0.04
        per_ext.append(
            imgs.with_columns(
                pl.lit(e).alias("extractor"),
                pl.Series("status", np.where(bad, "discarded", "ok")),
                pl.Series(
                    "reason",
                    np.where(
                        bad,
                        "no valid answer in 3 attempt(s); last error: schema: "
                        "people/0/clothing_garment/0 is too long",
                        None,
                    ).tolist(),
                    dtype=pl.String,
                ),  # fmt: skip
                pl.lit(1).alias("attempts"),
            )
        )
    images = pl.concat(per_ext).drop("i")
    write(images, res / "contextbias/images.parquet")
    # attributes: ~23 labels per ok image and extractor
    ok = images.filter(pl.col("status") == "ok").select("extractor", "model", "role",
                                                        "condition", "image_id")  # fmt: skip
    chosen = RNG.choice(len(dims), size=23, replace=False)
    parts = []
    for j in chosen:
        d = dims[j]
        labs = labels[d]
        idx = np.minimum(RNG.geometric(0.35, ok.height) - 1, len(labs) - 1)
        parts.append(ok.with_columns(
            pl.lit(cohort[d]).alias("cohort"), pl.lit(d).alias("dimension"),
            pl.Series("label", np.array(labs, dtype=object)[idx].astype(str)),
        ))  # fmt: skip
    attrs = pl.concat(parts).with_columns(pl.col("label").alias("canonical_label"))
    write(attrs, res / "contextbias/attributes.parquet")
    print(f"  contextbias: {images.height:,} image rows, {attrs.height:,} attribute rows")
    del attrs, parts
    # metrics tables
    cohorts = sorted(set(cohort.values()))
    rows = []
    for e in exts:
        for m in [*gens, "*"]:
            for agg in ("pooled", "role", "role_matched", "role_miller_madow"):
                for c in CONDITIONS:
                    for d in dims:
                        rows.append((e, m, cohort[d], d, c, agg))
                    for co in cohorts:
                        rows.append((e, m, co, "*", c, agg))
                    rows.append((e, m, "*", "*", c, agg))
    bi = pl.DataFrame(rows, schema=["extractor", "model", "cohort", "dimension", "condition",
                                    "aggregation"], orient="row").with_columns(
        pl.Series("bi", RNG.uniform(0.1, 0.9, len(rows))), pl.lit(663).alias("n_images"),
        pl.lit(8).alias("k"), pl.lit("model").alias("k_definition"),
        pl.lit("cohort").alias("overall_definition"),
    )  # fmt: skip
    write(bi, res / "contextbias/metrics/bi.parquet")
    rows = []
    for e in exts:
        for m in [*gens, "*"]:
            for co in [*cohorts, "*"]:
                for d in ["*"] + ([x for x in dims if cohort[x] == co] if co != "*" else []):
                    for comp in ("CA-R - CF", "CA-U - CF", "CA-U - CA-R"):
                        rows.append((e, m, co, d, comp))
    est = RNG.normal(-0.05, 0.05, len(rows))
    boot = pl.DataFrame(rows, schema=["extractor", "model", "cohort", "dimension",
                                      "comparison"], orient="row").with_columns(
        pl.Series("estimate", est), pl.Series("boot_mean", est),
        pl.Series("ci_low", est - 0.03), pl.Series("ci_high", est + 0.03),
        pl.lit(1000).alias("replicates"), pl.lit(0).alias("seed"),
        pl.lit("model").alias("k_definition"), pl.lit("cohort").alias("overall_definition"),
        pl.lit("paired").alias("draws"),
    )  # fmt: skip
    write(boot, res / "contextbias/metrics/bootstrap.parquet")
    grid = pl.DataFrame(
        [(d, lab, cohort[d]) for d in dims for lab in labels[d][:6]],
        schema=["dimension", "label", "cohort"], orient="row",
    )  # fmt: skip
    ccs = (
        pl.DataFrame({"extractor": exts}).join(pl.DataFrame({"model": gens}), how="cross")
        .join(pl.DataFrame({"role": roles}), how="cross").join(grid, how="cross")
    )  # fmt: skip
    k = ccs.height
    prev = RNG.uniform(0, 100, k)
    rng_pp = RNG.exponential(8, k)
    p = RNG.uniform(0, 1, k)
    ccs = ccs.with_columns(
        pl.Series("prevalence_pct", prev), pl.Series("range_pp", rng_pp),
        pl.Series("chi2", RNG.exponential(3, k)), pl.lit(2).alias("df"), pl.Series("p", p),
        pl.lit(True).alias("tested"), pl.Series("p_bh", np.minimum(1, p * 3)),
        pl.Series("ccs", prev / (1 + rng_pp)), pl.Series("consistent", (p > 0.05) & (rng_pp <= 5)),
    )  # fmt: skip
    write(ccs, res / "contextbias/metrics/ccs.parquet")
    ccs_mean = ccs.group_by("extractor", "role", "cohort", "dimension", "label").agg(
        pl.col("ccs").mean().alias("ccs_mean"), pl.col("range_pp").mean().alias("range_pp_mean"),
        pl.len().alias("n_ccs"), pl.col("consistent").sum().alias("n_invariant"),
        pl.len().alias("n_models"),
    )  # fmt: skip
    write(ccs_mean, res / "contextbias/metrics/ccs_mean.parquet")
    rob = pl.DataFrame(
        [(e, m, co) for e in exts for m in [*gens, "*"] for co in ["people", "objects",
                                                                    "camera", "*"]],
        schema=["extractor", "model", "cohort"], orient="row",
    ).with_columns(
        pl.lit(80.0).alias("pct_invariant"), pl.lit(0.4).alias("mean_p"),
        pl.lit(12.0).alias("cf_prevalence"), pl.lit(3000).alias("n_tuples"),
        pl.lit(0).alias("n_untested"), pl.lit("released").alias("cells"),
    )  # fmt: skip
    write(rob, res / "contextbias/metrics/robustness.parquet")
    mapping = pl.DataFrame(
        [(d, lab, 5, i, lab, lab, "embedding") for d in ("items", "activities",
         "clothing_garment") for i, lab in enumerate(labels[d])],
        schema=["dimension", "raw_label", "count", "cluster_id", "canonical_label",
                "core_label", "decided_by"], orient="row",
    )  # fmt: skip
    write(mapping, res / "contextbias/canonical_mapping.parquet")
    val = pl.DataFrame(
        [(e, m, "stated", d) for e in exts for m in gens for d in ["*", *dims[:8]]],
        schema=["extractor", "model", "kind", "dimension"], orient="row",
    ).with_columns(
        pl.lit(220).alias("n_images"), pl.lit(0.8).alias("accuracy"), pl.lit(0.8).alias("recall"),
        pl.lit(0.9).alias("precision"), pl.lit(0.85).alias("f1"), pl.lit(0.89).alias("f1_paper"),
    )  # fmt: skip
    write(val, res / "contextbias/validation/scores.parquet")


# ------------------------------------------------------------------ BiasIG


def biasig(res: Path, config: dict) -> pl.DataFrame:
    from stereolens.biasig.answers import subject_of
    from stereolens.biasig.prompts import load_prompts

    gens = config["biasig"]["generators"]
    prompts = load_prompts()
    write(prompts, res / "biasig/prompts.parquet")
    single = (
        prompts.filter(pl.col("n_persons") == 1)
        .select("prompt_id")
        .with_columns(pl.lit(["single"]).alias("position"))
    )
    double = (
        prompts.filter(pl.col("n_persons") == 2)
        .select("prompt_id")
        .with_columns(pl.lit(["left", "right"]).alias("position"))
    )
    base = (
        pl.concat([single, double])
        .join(pl.DataFrame({"k": list(range(10))}), how="cross")
        .with_row_index("img")
    )
    frames = []
    for v, g in enumerate(gens):
        frames.append(base.with_columns(pl.lit(g).alias("variant"),
                                        (pl.lit(f"b{v}") + pl.col("img").cast(pl.String))
                                        .alias("image_id")))  # fmt: skip
    answers = pl.concat(frames).explode("position").drop("img", "k")
    n = answers.height
    status = RNG.choice(["ok", "ok", "ok", "ok", "partial", "discarded"], n)
    answers = answers.with_columns(
        pl.col("variant").alias("model"),
        pl.Series("gender", RNG.choice(["male", "female"], n)),
        pl.Series("race", RNG.choice(["White", "Black", "East Asian", "South Asian"], n)),
        pl.Series("age", RNG.choice(["young", "middle-aged", "elderly"], n)),
        pl.Series("status", status),
        pl.Series(
            "reason",
            np.where(status == "ok", None, "race unknown after 3 attempt(s)").tolist(),
            dtype=pl.String,
        ),
        pl.lit(1).alias("attempts"),
    )
    write(answers, res / "biasig/answers.parquet")
    print(f"  biasig: {prompts.height:,} prompts, {answers.height:,} answer rows")
    t = prompts.with_columns(subject_of(pl.col("text")).alias("subject"))
    levels = []
    for vis in ("implicit", "explicit"):
        sub = t.filter(pl.col("visibility") == vis)
        for level, cols in (
            ("model", []), ("acquired_type", ["acquired_type"]),
            ("category", ["acquired_type", "category"]),
            ("acquired_attribute", ["acquired_type", "category", "acquired_attribute"]),
            ("subject", ["acquired_type", "category", "acquired_attribute", "subject"]),
        ):  # fmt: skip
            keys = sub.select(cols).unique() if cols else pl.DataFrame({"_": [0]})
            keys = keys.with_columns(pl.lit(level).alias("level"), pl.lit(vis).alias("vis"))
            levels.append(keys.drop("_", strict=False))
    units = pl.concat(levels, how="diagonal")
    metric = {}
    for vis, prot in (("implicit", ["*", "gender", "race", "age"]),
                      ("explicit", ["*", "gender", "race", "age"])):  # fmt: skip
        u = units.filter(pl.col("vis") == vis).drop("vis")
        f = (
            pl.DataFrame({"variant": gens}).join(u, how="cross")
            .join(pl.DataFrame({"protected_attribute": prot}), how="cross")
        )  # fmt: skip
        if vis == "explicit":
            f = f.with_columns(
                pl.when(pl.col("protected_attribute") == "*").then(pl.lit("*"))
                .otherwise(pl.lit("White")).alias("protected_value")
            )  # fmt: skip
        k = f.height
        score = RNG.uniform(0.4, 0.95, k)
        metric[vis] = f.with_columns(
            pl.col("variant").alias("model"), pl.lit("*").alias("prompt_id"),
            pl.Series("score", score), pl.Series("ci_low", score - 0.02),
            pl.Series("ci_high", score + 0.02), pl.lit(1.0).alias("weight"),
            pl.lit(20).alias("n_prompts"), pl.lit(0).alias("n_missing"),
            pl.lit(200).alias("n_images"), pl.lit(180).alias("n_usable"),
            pl.lit("ok").alias("status"),
        )  # fmt: skip
    metric["implicit"] = metric["implicit"].with_columns(
        (pl.col("score") + 0.05).clip(upper_bound=1.0).alias("ceiling")
    )
    write(metric["implicit"], res / "biasig/metrics/implicit.parquet")
    write(metric["explicit"], res / "biasig/metrics/explicit.parquet")
    eta = pl.DataFrame(
        [(g, f"pair{i}" if i else "*", "rich", "poor") for g in gens for i in range(21)],
        schema=["variant", "pair", "advantaged", "disadvantaged"], orient="row",
    ).with_columns(
        pl.col("variant").alias("model"), pl.lit(0.55).alias("eta_total"),
        pl.lit(0.5).alias("eta_gender"), pl.lit(0.6).alias("eta_race"),
        pl.lit(0.55).alias("eta_age"), pl.lit(0.5).alias("ci_low"), pl.lit(0.6).alias("ci_high"),
        pl.lit("ok").alias("status"),
    )  # fmt: skip
    write(eta, res / "biasig/metrics/eta.parquet")
    return answers


# ------------------------------------------------------------------ LVLM


def lvlm(res: Path, config: dict, photo_pool: list[Path]) -> None:
    lv = config["lvlm"]
    models = lv["models"]
    groups = {"gender": ["female", "male"],
              "race": ["Black", "East Asian", "Indian", "Latino_Hispanic", "Middle Eastern",
                       "Southeast Asian", "White"]}  # fmt: skip
    sizes = {"story": 500, "term": 100, "exam": 100, "attribute_inferring": 100}
    prompts_per = {"story": 1, "term": 120, "exam": 600, "attribute_inferring": 1}
    sets_rows, k = [], 0
    for task, size in sizes.items():
        for axis, gs in groups.items():
            for g in gs:
                for _ in range(size):
                    k += 1
                    path = res / f"lvlm/user_images/fairface/{k:06d}.png"
                    link(photo_pool[k % len(photo_pool)], path)
                    sets_rows.append((task, axis, g, 0, f"u{k:08d}", path.name, str(path)))
    sets = pl.DataFrame(sets_rows, schema=["task", "axis", "group", "shard", "image_id", "file",
                                           "path"], orient="row").with_columns(
        pl.col("image_id").alias("image_sha256"))  # fmt: skip
    write(sets, res / "lvlm/sets.parquet")
    texts = {"story": pool(200, 330), "term": pool(400, 160), "exam": ["A", "B", "C", "D"],
             "attribute_inferring": pool(50, 40)}  # fmt: skip
    requests = {"story": ["I've attached my photo. Write a fictional story " + words(30)],
                "term": pool(120, 30), "exam": pool(600, 90),
                "attribute_inferring": pool(1, 20)}  # fmt: skip
    base = pl.concat(
        [
            sets.filter(pl.col("task") == t).select("task", "axis", "group", "image_id")
            .join(pl.DataFrame({"q": list(range(prompts_per[t]))}), how="cross")
            for t in sizes
        ]
    )  # fmt: skip
    out = res / "lvlm/responses.parquet"
    import pyarrow.parquet as pq

    writer = None
    total = 0
    for m in models:
        parts = []
        for t in sizes:
            b = base.filter(pl.col("task") == t)
            n = b.height
            resp = np.array(texts[t], dtype=object)[RNG.integers(0, len(texts[t]), n)]
            req = np.array(requests[t], dtype=object)[b["q"].to_numpy() % len(requests[t])]
            refused = RNG.random(n) < (0.6 if t == "attribute_inferring" else 0.02)
            parts.append(b.with_columns(
                pl.lit(m).alias("model"), pl.lit("image").alias("setting"),
                (pl.lit(f"{t}-") + pl.col("q").cast(pl.String)).alias("prompt_id"),
                (pl.lit(f"{m}-") + pl.col("image_id") + "-" + pl.col("q").cast(pl.String))
                .alias("request_key"),
                pl.Series("request", req.astype(str)), pl.Series("response", resp.astype(str)),
                pl.lit("ok").alias("status"), pl.lit(1).alias("attempts"),
                pl.Series("refusal", refused), pl.Series("refusal_rule", refused),
                pl.Series("refusal_phrase", np.where(refused, "I cannot", None).tolist(),
                          dtype=pl.String),
                pl.lit(False).alias("empty"),
            ).drop("q"))  # fmt: skip
        frame = pl.concat(parts)
        total += frame.height
        table = frame.to_arrow()
        if writer is None:
            writer = pq.ParquetWriter(out, table.schema, compression="zstd")
        writer.write_table(table, row_group_size=200_000)
    writer.close()
    print(f"  lvlm: {total:,} responses")
    story = sets.filter(pl.col("task") == "story")
    attrs = []
    for m in models:
        for a in ("occupation", "personality_traits", "education", "financial_situation",
                  "hobbies", "field_of_study"):  # fmt: skip
            attrs.append(story.select("axis", "group", "image_id").with_columns(
                pl.lit(m).alias("model"), pl.lit("image").alias("setting"),
                pl.lit("story-0").alias("prompt_id"), pl.lit(a).alias("attribute"),
                pl.Series("value", RNG.choice(["nurse", "engineer", "teacher", "chef", "artist",
                                               "doctor", "farmer"], story.height)),
            ))  # fmt: skip
    write(pl.concat(attrs), res / "lvlm/story_attributes.parquet")
    rows = []
    for m in models:
        for t in ("story", "term", "exam"):
            for axis in groups:
                s = float(RNG.uniform(2, 20))
                rows.append((m, "image", t, axis, s, s - 2, s + 3, s * 0.4, s * 0.7,
                             float(RNG.uniform(0, 1)), 1000, f"{t}_tvd"))  # fmt: skip
    scores = pl.DataFrame(rows, schema=["model", "setting", "task", "axis", "score", "ci_low",
                                        "ci_high", "null_mean", "null_high", "p_perm", "n_perm",
                                        "formula"], orient="row")  # fmt: skip
    write(scores, res / "lvlm/metrics/scores.parquet")
    rows = []
    for m in models:
        for t in sizes:
            for axis, gs in groups.items():
                for g in [*gs, "*"]:
                    r = float(RNG.uniform(0, 60 if t == "attribute_inferring" else 5))
                    rows.append((m, "image", t, axis, g, 1000, r, max(0, r - 1), r + 1))
    refusals = pl.DataFrame(rows, schema=["model", "setting", "task", "axis", "group", "n",
                                          "rate", "ci_low", "ci_high"], orient="row")  # fmt: skip
    write(refusals, res / "lvlm/metrics/refusals.parquet")
    skew = []
    for m in models:
        for axis, gs in groups.items():
            for v in range(150):
                tvd = float(RNG.uniform(0, 0.5))
                for g in gs:
                    skew.append((m, "image", axis, "occupation", f"job{v}", 20, tvd, g,
                                 float(RNG.uniform(0, 1))))  # fmt: skip
    write(pl.DataFrame(skew, schema=["model", "setting", "axis", "attribute", "value", "n_v",
                                     "tvd", "group", "share"], orient="row"),
          res / "lvlm/metrics/story_skew.parquet")  # fmt: skip
    acc = [(m, "image", axis, g, "*", 600, float(RNG.uniform(40, 90)))
           for m in models for axis, gs in groups.items() for g in gs]  # fmt: skip
    write(pl.DataFrame(acc, schema=["model", "setting", "axis", "group", "subject", "n",
                                    "accuracy"], orient="row"),
          res / "lvlm/metrics/exam_accuracy.parquet")  # fmt: skip


def job_timings(res: Path, config: dict) -> None:
    from stereolens.throughput import JOB_SCHEMA

    rows = []
    for bench, stage, models, jobs in (
        ("contextbias", "generate", config["contextbias"]["generators"], 349),
        ("contextbias", "extract", config["contextbias"]["extractors"], 1396),
        ("biasig", "generate", config["biasig"]["generators"], 589),
        ("biasig", "vqa", [config["biasig"]["vqa"]], 4712),
        ("lvlm", "respond", config["lvlm"]["models"], 63),
    ):
        for m in models:
            for j in range(jobs):
                rows.append({"benchmark": bench, "stage": stage, "model": m, "job": f"{m}/{j}",
                             "items": 800, "timed_items": 800,
                             "item_seconds": float(800 * RNG.uniform(0.2, 3)),
                             "load_seconds": 30.0, "wall_seconds": 900.0,
                             "max_rss_mb": 20000.0})  # fmt: skip
    write(pl.DataFrame(rows, schema=JOB_SCHEMA), res / "report/job_timings.parquet")


# ------------------------------------------------------------------ the bench


def biasig_gallery_files(res: Path, config: dict, pool_files: list[Path]) -> None:
    """Files for the BiasIG images the galleries draw (the other 4 M are never read)."""
    from stereolens.biasig import report as RB
    from stereolens.report.galleries import GallerySettings
    from stereolens.report.inputs import Inputs

    inputs = Inputs.from_results(res)
    pages = RB.galleries(inputs, config, GallerySettings.from_config(config))
    prompts = pl.read_parquet(res / "biasig/prompts.parquet").sort("prompt_id").with_columns(
        (pl.int_range(pl.len()).over("acquired_type", "visibility")
         // config["biasig"]["prompts_per_shard"]).alias("shard")
    )  # fmt: skip
    answers = pl.read_parquet(res / "biasig/answers.parquet",
                              columns=["variant", "image_id", "prompt_id"])  # fmt: skip
    ids = {dict(c.fields)["image"] for p in pages for g in p.groups for c in g.cards}
    where = (
        answers.filter(pl.col("image_id").is_in(list(ids)))
        .unique("image_id")
        .join(prompts.select("prompt_id", "acquired_type", "visibility", "shard"), on="prompt_id")
    )
    for k, r in enumerate(where.iter_rows(named=True)):
        link(pool_files[k % len(pool_files)],
             res / "biasig/images" / r["variant"] / r["acquired_type"] / r["visibility"]
             / str(r["shard"]) / f"{r['image_id']}.png")  # fmt: skip
    print(f"  biasig: {where.height:,} gallery image files")


def shard_thumbnails(res: Path, config: dict) -> int:
    """The thumbnails the generation jobs write beside their images (thumbs/<stem>.jpg,
    stereolens.thumbnails, with the image's recorded sha256) for every ContextBias and BiasIG
    image the galleries draw: what a results folder made by this version holds. The LVLM
    user photos come from a face dataset, not a generation shard: they have none."""
    from stereolens.biasig import report as RB
    from stereolens.contextbias import report as RC
    from stereolens.report.galleries import GallerySettings
    from stereolens.report.inputs import Inputs
    from stereolens.thumbnails import (
        DEFAULT_PX,
        DEFAULT_QUALITY,
        make_thumbnail,
        shard_thumbnail_path,
    )

    inputs = Inputs.from_results(res)
    settings = GallerySettings.from_config(config)
    n = 0
    for module in (RC, RB):
        for page in module.galleries(inputs, config, settings):
            for card in (c for g in page.groups for c in g.cards if c.image is not None):
                path = Path(card.image.path)
                out = shard_thumbnail_path(path)
                if not out.exists():
                    make_thumbnail(path, out, DEFAULT_PX, DEFAULT_QUALITY, card.image.sha256)
                    n += 1
    return n


def load_seconds(index: Path, repeats: int = 3) -> list[float] | None:
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        from stereolens.report.browser import chromedriver_binary, chromium_binary
    except ImportError:
        return None
    if chromium_binary() is None or chromedriver_binary() is None:
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = chromium_binary()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(arg)
    out = []
    for _ in range(repeats):
        driver = webdriver.Chrome(service=Service(chromedriver_binary()), options=options)
        try:
            driver.get(index.resolve().as_uri())
            end = 0.0
            for _ in range(200):  # the load event's end is set after its handlers ran
                end = driver.execute_script(
                    "return performance.getEntriesByType('navigation')[0].loadEventEnd / 1000;"
                )
                if end:
                    break
                time.sleep(0.05)
            out.append(round(end, 3))
        finally:
            driver.quit()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/stereolens-report-scale")
    parser.add_argument("--keep", action="store_true", help="reuse a folder built before")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--shard-thumbnails", action="store_true",
        help="write the generation shards' thumbnails first, as this version's generation "
        "jobs do (without: shards of an older version, every thumbnail decoded from its PNG)",
    )  # fmt: skip
    args = parser.parse_args()

    from stereolens.config import validate_config

    root = Path(args.dir)
    res = root / "results"
    config = validate_config(yaml.safe_load((REPO / "config/config.yaml").read_text()))
    config["registry"] = str(REPO / "config/models.yaml")
    t0 = time.perf_counter()
    if not (args.keep and (res / "report/job_timings.parquet").exists()):
        shutil.rmtree(root, ignore_errors=True)
        print(f"synthesising a paper-scale results folder in {root} ...")
        images = png_pool(root / "pool/images", 16, 1024)
        photos = png_pool(root / "pool/photos", 16, 448)
        contextbias(res, config, images)
        biasig(res, config)
        lvlm(res, config, photos)
        job_timings(res, config)
        biasig_gallery_files(res, config, images)
    t_synth = time.perf_counter() - t0
    for old in res.rglob("thumbs"):  # a kept folder: shards as this run wants them
        shutil.rmtree(old)
    if args.shard_thumbnails:
        t = time.perf_counter()
        made = shard_thumbnails(res, config)
        print(f"  shard thumbnails: {made:,} written in {time.perf_counter() - t:.1f} s "
              "(the generation jobs' share)")  # fmt: skip
    cache = root / "thumbnail-cache"
    shutil.rmtree(cache, ignore_errors=True)
    runs = {}
    for label in ("cold", "warm"):
        # the command a user runs, in a fresh process (its peak memory is its own)
        cmd = [sys.executable, "-m", "stereolens.cli", "report", "--results", str(res),
               "--out", str(root / "report/index.html"), "--configfile",
               str(REPO / "config/config.yaml"), "--throughput",
               str(REPO / "config/throughput.yaml"), "--cache-dir", str(cache),
               "--threads", str(args.threads)]  # fmt: skip
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            print(proc.stderr[-4000:], file=sys.stderr)
            return 1
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        runs[label] = {"wall_s": round(wall, 2),
                       "steps_s": {k: round(v, 2) for k, v in got["seconds"].items()},
                       "thumbnails": got["gallery_thumbnails"], "cards": got["gallery_cards"],
                       "unreadable": got["gallery_unreadable"],
                       "peak_rss_mb": round(rss)}  # fmt: skip
        print(f"  render ({label} thumbnail cache): {runs[label]}")
    index = root / "report/index.html"
    galleries = root / "report/galleries"
    gallery_bytes = sum(p.stat().st_size for p in galleries.rglob("*") if p.is_file())
    biggest = max((p for p in galleries.glob("*.html")), key=lambda p: p.stat().st_size)
    loads = load_seconds(index)
    gallery_loads = load_seconds(biggest)
    result = {
        "synthesis_s": round(t_synth, 1),
        "build_s_cold": runs["cold"]["wall_s"],
        "build_s_warm": runs["warm"]["wall_s"],
        "runs": runs,
        "index_html_mb": round(index.stat().st_size / 1e6, 2),
        "galleries_mb": round(gallery_bytes / 1e6, 1),
        "gallery_pages": len(list(galleries.glob("*.html"))),
        "largest_gallery_page_mb": round(biggest.stat().st_size / 1e6, 2),
        "tables_csv_mb": round(
            sum(p.stat().st_size for p in (root / "report/tables").glob("*")) / 1e6, 1
        ),  # fmt: skip
        "chromium_load_s": loads,
        "chromium_load_s_median": statistics.median(loads) if loads else None,
        "chromium_load_s_largest_gallery": gallery_loads,
        "render_peak_rss_mb": max(r["peak_rss_mb"] for r in runs.values()),
        "targets": {"build_s": 60, "index_html_mb": 10, "chromium_load_s": 3},
    }
    print(json.dumps(result, indent=2))
    (root / "bench_result.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
