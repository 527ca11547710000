"""Entry point of rules merge_lvlm_model_responses (one model's response shards, refusal
labels, story readings and judgements -> its part of each table) and merge_lvlm_responses
(the models' parts -> the merged tables)."""

from stereolens.lvlm.layout import LAYOUT
from stereolens.lvlm.merge import TABLES, merge_model_parts, merge_model_tables
from stereolens.workflow_support import run_logged


def main(log):
    smk = snakemake  # noqa: F821
    out = {name: smk.output[name] for name in TABLES}
    if smk.rule == "merge_lvlm_model_responses":
        counts = merge_model_tables(
            response_paths=list(smk.input.responses),
            refusal_paths=list(smk.input.refusals),
            story_paths=list(smk.input.stories),
            judgement_paths=list(smk.input.judgements),
            out=out,
        )
    else:
        parts = {}
        for name in TABLES:
            for path in smk.input[name]:
                model = LAYOUT.parse(path).keys["model"]  # merged/{model}/{table}.parquet
                parts.setdefault(model, {})[name] = path
        counts = merge_model_parts(parts, out)
    for name, rows in counts.items():
        log.info("%s: %d row(s) -> %s", name, rows, out[name])


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
