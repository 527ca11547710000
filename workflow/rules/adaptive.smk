# The adaptive design's rounds (design.mode adaptive, issue 23; docs/planner.md "Adaptive
# design"): one checkpoint per benchmark x round x group, and the table of all rounds. The
# input functions that read the checkpoints are in workflow/rules/inputs/adaptive.smk.


checkpoint adaptive_round:
    """Interim analysis after one round of one group: the benchmark's headline estimate
    on the cumulative shards, its repeated confidence interval at the round's critical
    value, and whether each cell stops."""
    input:
        unpack(get_adaptive_round_input),
    output:
        ADAPTIVE.round,
    log:
        "logs/{benchmark}/adaptive/round_{round}/{model}.log",
    benchmark:
        "benchmarks/{benchmark}/adaptive/round_{round}/{model}.tsv"
    wildcard_constraints:
        round=r"[1-9][0-9]*",
        benchmark="|".join(ROUNDS) or "(?!)",
    conda:
        "../../envs/analysis.yaml"
    params:
        settings=get_adaptive_settings,
    script:
        "../scripts/adaptive_round.py"


rule collect_adaptive_decisions:
    """The table of all rounds: every group's round tables, concatenated, with the
    GPU-hours cap the rounds were cut to."""
    input:
        get_adaptive_decisions_input,
    output:
        ADAPTIVE.decisions,
    log:
        "logs/{benchmark}/adaptive/decisions.log",
    wildcard_constraints:
        benchmark="|".join(ROUNDS) or "(?!)",
    conda:
        "../../envs/analysis.yaml"
    params:
        budget=get_adaptive_budget,
    script:
        "../scripts/collect_adaptive_decisions.py"
