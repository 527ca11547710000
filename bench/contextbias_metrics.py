"""Benchmark of the ContextBias metrics stage at paper scale.

Builds a synthetic attributes table shaped like the paper's run (4 models x 92 roles x
3 conditions x 6 prompts x 10 seeds = 66,240 images; the 29 counted dimensions of the
shipped schema; closed people dimensions with skewed role-specific distributions; open
vocabularies of a few hundred labels; list dimensions with several labels per image), then
times

1. the whole `stereolens contextbias metrics` command (all five tables, bootstrap with
   1,000 replicates) in a fresh process, with its peak resident memory;
2. each table's function in this process;
3. the vectorised cluster bootstrap against the per-replicate loop (the loop on fewer
   replicates, scaled linearly), checking that both give the same table.

Run: .venv/bin/python bench/contextbias_metrics.py [--replicates 1000] [--loop-replicates 50]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

from stereolens.contextbias import bootstrap, bootstrap_loop, robustness
from stereolens.contextbias import ccs as ccs_module
from stereolens.contextbias.metrics import CONDITIONS, bi_table
from stereolens.contextbias.schema import AttributeSchema
from stereolens.contextbias.settings import ContextBiasSettings

N_MODELS, N_ROLES, N_PROMPTS, N_SEEDS = 4, 92, 6, 10
OPEN_VOCAB = {"items": 400, "activities": 250, "clothing_garment": 300}
LIST_LABELS = (1, 4)  # labels per image in list dimensions: uniform in [1, 4], deduplicated


def synthetic_tables(seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(attributes, images) at paper scale."""
    rng = np.random.default_rng(seed)
    schema = AttributeSchema.load()
    models = [f"model{i}" for i in range(N_MODELS)]
    roles = [f"role{i:02d}" for i in range(N_ROLES)]
    m, r, c, p, s = np.meshgrid(
        np.arange(N_MODELS),
        np.arange(N_ROLES),
        np.arange(3),
        np.arange(N_PROMPTS),
        np.arange(N_SEEDS),
        indexing="ij",
    )
    m, r, c, p, s = (a.ravel() for a in (m, r, c, p, s))
    n_img = m.size
    image_id = np.char.add("img", np.arange(n_img).astype(str))
    images = pl.DataFrame(
        {
            "model": np.array(models)[m],
            "role": np.array(roles)[r],
            "condition": np.array(CONDITIONS)[c],
            "prompt_id": np.char.add(
                np.char.add(np.array(roles)[r], np.array(CONDITIONS)[c]), p.astype(str)
            ),
            "variant": np.where(p % 2 == 0, "phrasing", "substitution"),
            "seed": s,
            "image_id": image_id,
            "status": "ok",
        }
    )
    group = (m * N_ROLES + r) * 3 + c  # model x role x condition
    n_groups = N_MODELS * N_ROLES * 3
    frames = []
    for dim in schema.counted_dimensions:
        vocab = dim.vocabulary
        labels = (
            np.array([v for v in vocab if v not in ("unknown", "none")])
            if vocab
            else np.array([f"{dim.name}_{i}" for i in range(OPEN_VOCAB[dim.name])])
        )
        v = labels.size
        # role prior (sharp for people, flatter for scene), shifted per model and condition
        alpha = 0.3 if dim.cohort == "people" else 0.8
        prior = rng.dirichlet(np.full(v, alpha), size=N_ROLES)
        probs = np.empty((n_groups, v))
        for g_m in range(N_MODELS):
            for g_c in range(3):
                shift = rng.dirichlet(np.full(v, 2.0), size=N_ROLES)
                mix = 0.75 * prior + 0.25 * shift
                idx = (g_m * N_ROLES + np.arange(N_ROLES)) * 3 + g_c
                probs[idx] = mix / mix.sum(1, keepdims=True)
        cdf = np.cumsum(probs, axis=1)
        per_image = (
            rng.integers(*LIST_LABELS, endpoint=True, size=n_img)
            if dim.kind == "list"
            else (
                1 + (rng.random(n_img) < 0.15)  # a second person in 15% of the images
                if dim.per_person
                else np.ones(n_img, dtype=int)
            )
        )
        slots = int(per_image.max())
        rows, labs = [], []
        for j in range(slots):
            take = np.flatnonzero(per_image > j)
            u = rng.random(take.size)
            lab = (u[:, None] > cdf[group[take]]).sum(1).clip(max=v - 1)
            rows.append(take)
            labs.append(lab)
        rows_a, labs_a = np.concatenate(rows), np.concatenate(labs)
        # a label counts once per image
        key = np.unique(rows_a.astype(np.int64) * v + labs_a)
        img, lab = key // v, key % v
        frames.append(
            pl.DataFrame(
                {
                    "i": img,
                    "cohort": dim.cohort,
                    "dimension": dim.name,
                    "label": labels[lab],
                }
            )
        )
    long = pl.concat(frames)
    attributes = long.join(
        images.drop("status").with_row_index("i").with_columns(pl.col("i").cast(pl.Int64)),
        on="i",
    ).drop("i")
    attributes = attributes.select(
        "model",
        "role",
        "condition",
        "variant",
        "prompt_id",
        "seed",
        "image_id",
        "cohort",
        "dimension",
        "label",
    )
    return attributes, images


def _timed(label: str, fn, results: dict):
    tracemalloc.start()
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    results[label] = (seconds, peak / 2**20)
    print(f"  {label:<44} {seconds:8.2f} s   peak (numpy/python) {peak / 2**20:8.1f} MiB")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicates", type=int, default=1000)
    ap.add_argument("--loop-replicates", type=int, default=50)
    ap.add_argument("--matched-draws", type=int, default=20)
    args = ap.parse_args()

    start = time.perf_counter()
    attributes, images = synthetic_tables()
    print(
        f"synthetic data: {images.height:,} images, {attributes.height:,} attribute rows, "
        f"{attributes['dimension'].n_unique()} dimensions, "
        f"{attributes.select('model', 'role', 'dimension', 'label').n_unique():,} "
        f"model x role x label tuples ({time.perf_counter() - start:.1f} s to build)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        a_path, i_path = Path(tmp) / "attributes.parquet", Path(tmp) / "images.parquet"
        attributes.write_parquet(a_path)
        images.write_parquet(i_path)
        cmd = [
            sys.executable,
            "-m",
            "stereolens.cli",
            "contextbias",
            "metrics",
            "--attributes",
            str(a_path),
            "--images",
            str(i_path),
            "--out",
            str(Path(tmp) / "out"),
            "--preset",
            json.dumps(
                {"metrics": {"replicates": args.replicates, "matched_draws": args.matched_draws}}
            ),
        ]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        whole = time.perf_counter() - start
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(
            f"whole stage (CLI, fresh process, {args.replicates} replicates): {whole:.1f} s, "
            f"peak RSS {rss:.0f} MiB"
        )

    print("per table (this process):")
    res: dict = {}
    settings = replace(ContextBiasSettings.preset(), matched_draws=args.matched_draws)
    _timed(
        "bi.parquet (pooled + 3 per-role + '*')",
        lambda: bi_table(attributes, images, settings=settings),
        res,
    )
    ccs = _timed("ccs.parquet", lambda: ccs_module.ccs_table(attributes, images), res)
    _timed("ccs_mean.parquet", lambda: ccs_module.ccs_mean(ccs), res)
    for cells in ("condition", "prompt"):
        _timed(
            f"robustness.parquet (cells = {cells})",
            lambda cells=cells: robustness.robustness_summary(
                robustness.robustness_tests(attributes, images, cells=cells)
            ),
            res,
        )
    data = _timed(
        "bootstrap: building the count matrices",
        lambda: bootstrap._bootstrap_data(attributes, "model", None),
        res,
    )
    vec = _timed(
        f"bootstrap replicates, vectorised, B = {args.replicates}",
        lambda: bootstrap._bootstrap_vectorised(data, args.replicates, 0),
        res,
    )
    loop = _timed(
        f"bootstrap replicates, loop, B = {args.loop_replicates}",
        lambda: bootstrap_loop._bootstrap_loop(data, args.loop_replicates, 0),
        res,
    )
    small = bootstrap._bootstrap_vectorised(data, args.loop_replicates, 0)
    vec_s = res[f"bootstrap replicates, vectorised, B = {args.replicates}"][0]
    loop_s = res[f"bootstrap replicates, loop, B = {args.loop_replicates}"][0] * (
        args.replicates / args.loop_replicates
    )
    print(
        f"  B = {args.replicates}: vectorised {vec_s:.2f} s, loop {loop_s:.1f} s (scaled "
        f"from B = {args.loop_replicates}): {loop_s / vec_s:.0f}x"
    )
    print(
        f"  loop and vectorised tables identical at B = {args.loop_replicates}: "
        f"{small.equals(loop)}"
    )
    print(
        f"  bootstrap rows: {vec.height}; overall CA-U - CF across models: "
        + str(
            vec.filter(
                (pl.col("model") == "*")
                & (pl.col("cohort") == "*")
                & (pl.col("comparison") == "CA-U - CF")
            )
            .select("estimate", "ci_low", "ci_high")
            .row(0)
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
