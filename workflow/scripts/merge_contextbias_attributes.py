"""Entry point of rule merge_contextbias_attributes."""

from stereolens.atomic import write_parquet
from stereolens.contextbias.merge import merge_extractions
from stereolens.contextbias.schema import AttributeSchema
from stereolens.workflow_support import run_logged


def main(log):
    schema = AttributeSchema.load(snakemake.input.schema)  # noqa: F821
    attributes, images = merge_extractions(list(snakemake.input.extractions), schema)  # noqa: F821
    write_parquet(snakemake.output.images, images)  # noqa: F821
    write_parquet(snakemake.output.attributes, attributes)  # noqa: F821
    log.info(
        "%d images (%s), %d attribute rows",
        images.height,
        dict(images["status"].value_counts().iter_rows()),
        attributes.height,
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
