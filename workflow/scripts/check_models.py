"""Entry point of rule check_models: the configured models' one-request check."""

from stereolens.atomic import write_text
from stereolens.check_models import format_table, quiet_progress_bars, run_checks, tsv
from stereolens.generate.job import limit_threads
from stereolens.registry import load_registry
from stereolens.workflow_support import run_logged


def main(log):
    p = snakemake.params  # noqa: F821
    limit_threads(snakemake.threads)  # noqa: F821
    quiet_progress_bars()
    rows = run_checks(load_registry(p.registry), list(p.models), weights=p.weights)
    log.info("\n%s", format_table(rows))
    failed = [r.model for r in rows if not r.ok]
    if failed:
        raise RuntimeError(
            f"check_models: {len(failed)} of {len(rows)} models failed ({', '.join(failed)}); "
            "the table above says why. Fix their registry entries (or set "
            "check_models.enabled: false) and rerun."
        )
    write_text(snakemake.output[0], tsv(rows))  # noqa: F821


run_logged(snakemake, main)  # noqa: F821
