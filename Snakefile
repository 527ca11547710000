# stereolens: social-bias audits of generative vision models.
# This file is a table of contents; logic lives in the stereolens package,
# shared input functions in workflow/rules/common.smk; each benchmark's rules and input
# functions are the files its plug-in names (stereolens.benchmark).

from snakemake.utils import min_version

min_version("9.0")


# The embedded default unless --configfile names another config (a plain
# `configfile:` would merge the two).
if not config:

    configfile: "config/demo.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/inputs/adaptive.smk"
include: "workflow/rules/adaptive.smk"


# each registered benchmark's rules (stereolens.benchmark: its plug-in names them)
for rules in get_benchmark_rules():

    include: rules


include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        get_final_targets(),
