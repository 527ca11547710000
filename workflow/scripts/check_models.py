"""Entry point of rule check_models: one model's one-request check."""

from stereolens.atomic import write_text
from stereolens.check_models import (
    CheckRow,
    check_entry,
    format_table,
    quiet_progress_bars,
    tsv,
)
from stereolens.models.job import limit_threads
from stereolens.models.registry import load_registry
from stereolens.workflow_support import run_logged


def main(log):
    name = snakemake.wildcards.model  # noqa: F821
    check = snakemake.config["check_models"]  # noqa: F821
    spec = load_registry(snakemake.params.registry)[name]  # noqa: F821
    if not check["enabled"]:
        log.info("check_models is off (config check_models.enabled): %s not checked", name)
        row = CheckRow(name, spec.backend, accepted="not checked: check_models is off")
        row.ok, row.source = True, "off"
        write_text(snakemake.output[0], tsv([row]))  # noqa: F821
        return
    limit_threads(snakemake.threads)  # noqa: F821
    quiet_progress_bars()
    row = check_entry(spec, weights=check["weights"])
    log.info("\n%s", format_table([row]))
    if not row.ok:
        raise RuntimeError(
            f"check_models: {name} failed: {row.accepted}. Fix its registry entry (or set "
            "check_models.enabled: false) and rerun."
        )
    write_text(snakemake.output[0], tsv([row]))  # noqa: F821


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
