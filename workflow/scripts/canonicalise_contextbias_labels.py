"""Entry point of rule canonicalise_contextbias_labels."""

from stereolens.atomic import atomic_path
from stereolens.contextbias.canonical import mapping_summary, run_canonicalisation
from stereolens.models.job import limit_threads
from stereolens.models.registry import load_registry
from stereolens.workflow_support import run_logged


def main(log):
    settings = snakemake.params.settings  # noqa: F821
    limit_threads(snakemake.threads)  # noqa: F821
    llm = settings["llm"]
    llm_spec = load_registry(snakemake.params.registry)[llm] if llm else None  # noqa: F821
    mapping, _ = run_canonicalisation(
        snakemake.input.attributes,  # noqa: F821
        snakemake.output.mapping,  # noqa: F821
        snakemake.output.attributes,  # noqa: F821
        encoder=settings["encoder"],
        threshold=settings["threshold"],
        llm_spec=llm_spec,
        overrides=settings["overrides"],
        dimensions=None if settings["enabled"] else (),
        cache_dir=snakemake.params.cache_dir,  # noqa: F821
        llm_max_labels=settings["llm_max_labels"],
        return_attributes=False,
    )
    # the same mapping as CSV, for review and as the template of an overrides file
    with atomic_path(snakemake.output.review, suffix=".csv") as tmp:  # noqa: F821
        mapping.write_csv(tmp)
    log.info("canonical mapping: %s", mapping_summary(mapping))


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
