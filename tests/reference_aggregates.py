"""Reference implementations of the aggregate stages, kept only for the tests: the earlier,
simpler code that the streamed merges and the faster resampler must equal
(tests/test_aggregates.py on a synthetic run, tests/test_workflow.py on the demo's shards).

One section per benchmark; each function says which package function it is the reference
of. They are not part of the package: nothing under src/ may import them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from stereolens.atomic import read_jsonl
from stereolens.biasig import answers as biasig_answers
from stereolens.biasig import metrics as biasig_metrics
from stereolens.biasig.answers import Prepared, _code_columns, _unit_table
from stereolens.biasig.groups import replicate_moments
from stereolens.biasig.metrics import _accumulators
from stereolens.biasig.resample import _block_bounds, _counts_from_draws, _run_stream


# ============================================================================================
# BiasIG (stereolens.biasig)
# ============================================================================================
def biasig_merge_answers_reference(
    paths: list[str | Path], registry: dict | None = None
) -> pl.DataFrame:
    """The earlier merge (json.loads per row, one DataFrame from the dicts): the reference
    of :func:`stereolens.biasig.merge.answers_frame`."""
    rows = [r for path in paths for r in read_jsonl(path)]
    for r in rows:
        r.pop("attempt_log", None)
        name = r["model"]
        spec = (registry or {}).get(name)
        r["variant"] = name
        r["model"] = (spec.get("variant_of") if spec is not None else None) or name
    frame = pl.DataFrame(rows, infer_schema_length=None)
    return frame.sort("model", "variant", "prompt_id", "image_id", "position")


def biasig_image_table_reference(a: pl.DataFrame, table: pl.DataFrame, scoring_unit: str, radix):
    """:func:`stereolens.biasig.answers._image_table` as the earlier code built it (grouped
    and sorted on the string columns). Patch it in as ``stereolens.biasig.answers.
    _image_table``, where :func:`~stereolens.biasig.answers.prepare_answers` looks it up."""
    a = a.join(table.select("prompt_id", "unit"), on="prompt_id", how="left")
    images = (
        a.group_by("variant", "model", "unit", "image_id")
        .agg(*_code_columns())
        .sort("variant", "model", "unit", "image_id")
    )
    units = (
        images.group_by("variant", "model", "unit", maintain_order=True)
        .agg(pl.len().alias("n_images"))
        .join(_unit_table(table, scoring_unit), on="unit", how="left", maintain_order="left")
    )
    return images, units


def biasig_bootstrap_blocks_reference(prep: Prepared, replicates: int, seed: int):
    """Yield (first unit, end unit, counts (units, R, 2, 9)) block by block: the images of
    each unit resampled with replacement, R times, counted through one key per drawn image,
    person and attribute. The earlier implementation, the reference of
    :class:`stereolens.biasig.resample.Resampler` (the same draws, the same counts)."""
    for variant, model, u_start, u_end in prep.runs:
        rng = _run_stream(seed, variant, model)
        for u0, u1 in _block_bounds(prep, replicates, u_start, u_end):
            i0, i1 = prep.offsets[u0], prep.offsets[u1]
            sizes = np.diff(prep.offsets[u0 : u1 + 1])
            local = np.repeat(np.arange(u1 - u0), sizes)
            starts = prep.offsets[u0:u1] - i0
            draw = rng.random((replicates, i1 - i0))
            idx = starts[local] + (draw * sizes[local]).astype(np.int64)
            yield u0, u1, _counts_from_draws(prep.codes[i0:i1][idx], local, u1 - u0, replicates)


def biasig_bootstrap_reference(prep, imp, exp, eta, replicates, seed, ci, threads=1):
    """:func:`stereolens.biasig.metrics._bootstrap` as the earlier code computed it (block by
    block, every unit's counts in full, dense sums over all groups). Patch it in as
    ``stereolens.biasig.metrics._bootstrap``, where
    :func:`~stereolens.biasig.metrics.compute_metrics` looks it up."""
    acc = _accumulators(prep, imp, exp, eta, replicates)
    for u0, u1, counts in biasig_bootstrap_blocks_reference(prep, replicates, seed):
        if imp:
            sel = np.flatnonzero(imp.mask[u0:u1])
            if sel.size:
                us = u0 + sel
                scores, avail = imp.prompt_scores(counts[sel], us)
                acc["imp_moments"][:, us] = replicate_moments(scores, axis=1)
                num, den = imp.sums(scores, avail, us)
                acc["imp_num"] += num
                acc["imp_den"] += den
        if exp:
            sel = np.flatnonzero(exp.mask[u0:u1])
            if sel.size:
                us = u0 + sel
                person = exp.person_accuracy(counts[sel], us)
                acc["exp_moments"][:, us] = replicate_moments(exp.prompt_scores(person), 1)
                num, den = exp.sums(person, us)
                acc["exp_num"] += num
                acc["exp_den"] += den
        if eta:
            sel = np.flatnonzero(eta.mask[u0:u1])
            if sel.size:
                acc["eta"] += eta.sums(counts[sel], u0 + sel)
    return acc


def biasig_patch_references(setattr_) -> dict[str, int]:
    """Put the BiasIG references in place of the package functions, in the modules that look
    them up at call time (``stereolens.biasig.metrics._bootstrap``,
    ``stereolens.biasig.answers._image_table``), through ``setattr_`` (``monkeypatch.setattr``
    or a setattr whose originals the caller restores). Returns the number of calls of each
    reference so far: a caller checks they ran, which a patch in the wrong module would not."""
    calls = {"bootstrap": 0, "image_table": 0}

    def bootstrap(*args, **kwargs):
        calls["bootstrap"] += 1
        return biasig_bootstrap_reference(*args, **kwargs)

    def image_table(*args, **kwargs):
        calls["image_table"] += 1
        return biasig_image_table_reference(*args, **kwargs)

    setattr_(biasig_metrics, "_bootstrap", bootstrap)
    setattr_(biasig_answers, "_image_table", image_table)
    return calls


# ============================================================================================
# end of BiasIG
# ============================================================================================
