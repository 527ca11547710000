"""ContextBias's interim estimate for the adaptive design (its plug-in's ``rounds``): the shift
BI(CA-U) - BI(CF) overall per extractor x generator on the rounds' extraction shards, with its
bc-t standard error (docs/planner.md, "Adaptive design", "Interim analysis")."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from stereolens.contextbias.bootstrap import level_replicates
from stereolens.contextbias.comparisons import SHIFT
from stereolens.contextbias.merge import merge_extractions
from stereolens.contextbias.metrics import ALL, CONDITIONS
from stereolens.contextbias.schema import AttributeSchema
from stereolens.contextbias.settings import ContextBiasSettings

EFFECT = "contextbias.bi_shift"
"""The planner's name of the headline shift (``stereolens plan --power``); a cell's effect
is ``contextbias.bi_shift:<generator>``, and design.adaptive.width / margin may name either."""


def interim(config: dict, paths: Sequence[str]) -> pl.DataFrame:
    """One row per (extractor, generator) of the extraction shards ``paths``: extractor,
    model, cell, effect, estimate, se, df (see the module's docstring)."""
    cb = config["contextbias"]
    if not paths:
        raise ValueError("the interim analysis got no extraction shard")
    schema = AttributeSchema.load(cb["extraction"]["schema"])
    attributes, images = merge_extractions(list(paths), schema)
    # every extractor x generator of the shards is a cell, also one without a label yet (an
    # extractor that discarded every image): no estimate, so it continues
    cells = images.select("extractor", "model").unique().sort("extractor", "model").rows()
    if not cells:
        raise ValueError(f"the extraction shards {list(paths)[:3]} ... hold no image")
    st = ContextBiasSettings.from_config(cb)
    rows = {
        (e, m): {
            "extractor": e, "model": m, "cell": f"{e} / {m} / CA-U - CF / overall",
            "effect": f"{EFFECT}:{m}", "estimate": float("nan"), "se": None, "df": None,
        }
        for e, m in cells
    }  # fmt: skip
    if attributes.height:
        _estimates(attributes, schema, st, rows)
    return pl.DataFrame(
        list(rows.values()),
        schema={
            "extractor": pl.String, "model": pl.String, "cell": pl.String, "effect": pl.String,
            "estimate": pl.Float64, "se": pl.Float64, "df": pl.Int64,
        },
    )  # fmt: skip


def _estimates(attributes: pl.DataFrame, schema: AttributeSchema, st, rows: dict) -> None:
    """Fill ``rows`` ((extractor, model) -> row) with the bootstrap's estimate, se and df."""
    opts = st.bootstrap_options()
    lv = level_replicates(attributes, k_definition=st.k_definition, schema=schema, **opts)
    li = lv.levels.index((ALL, ALL))
    a, b = CONDITIONS.index(SHIFT[0]), CONDITIONS.index(SHIFT[1])
    r = lv.n_roles
    for g, key in enumerate(lv.keys):
        keys = dict(zip(lv.gkeys, key, strict=True))
        plug = lv.estimate[g, li, a] - lv.estimate[g, li, b]
        rep = lv.replicates[g, :, li, a] - lv.replicates[g, :, li, b]
        rep = rep[np.isfinite(rep)]
        row = rows[(keys.get("extractor"), keys["model"])]
        row["estimate"] = float(2 * plug - rep.mean()) if rep.size else float("nan")
        if r >= max(2, st.interval_min_roles) and rep.size > 1:
            row["se"] = float(np.std(rep, ddof=1) * np.sqrt(r / (r - 1)))
        row["df"] = r - 1 if r > 1 else None
