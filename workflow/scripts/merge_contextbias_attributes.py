"""Entry point of rules merge_contextbias_model_attributes and merge_contextbias_validation
(extraction shards -> attributes and images tables) and merge_contextbias_attributes (the
(extractor, generator) parts -> attributes_raw.parquet and images.parquet)."""

from stereolens.contextbias.merge import merge_extraction_part, merge_extraction_parts
from stereolens.contextbias.schema import AttributeSchema
from stereolens.workflow_support import run_logged


def main(log):
    smk = snakemake  # noqa: F821
    if "extractions" in smk.input.keys():
        images, labels = merge_extraction_part(
            list(smk.input.extractions),
            AttributeSchema.load(smk.input.schema),
            smk.output.attributes,
            smk.output.images,
        )
        log.info("%d images, %d attribute rows", images, labels)
    else:
        counts = merge_extraction_parts(
            list(smk.input.attributes_raw),
            list(smk.input.images),
            smk.output.attributes,
            smk.output.images,
        )
        labels = counts.pop("labels")
        log.info("%d images (%s), %d attribute rows", sum(counts.values()), counts, labels)


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
