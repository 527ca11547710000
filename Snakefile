# stereolens: social-bias audits of generative vision models.
# This file is a table of contents; logic lives in the stereolens package,
# input functions in workflow/rules/common.smk (shared) and workflow/rules/inputs/.

from snakemake.utils import min_version

min_version("9.0")


# The embedded default unless --configfile names another config (a plain
# `configfile:` would merge the two).
if not config:

    configfile: "config/demo.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/contextbias.smk"
include: "workflow/rules/contextbias_studies.smk"
include: "workflow/rules/biasig.smk"
include: "workflow/rules/lvlm.smk"
include: "workflow/rules/design.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        get_final_targets(),
