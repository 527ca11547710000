# Config validation, registry, wildcard constraints and the shared input functions (each
# benchmark's own are in its rules files, which the Snakefile includes from its plug-in).
# Module-level code stays cheap: every SLURM job re-parses this file.

import inspect
import json
import os
import shlex
from functools import lru_cache

from snakemake.common import overwrite_function_params

from stereolens.benchmark import benchmark as benchmark_plugin
from stereolens.benchmark import benchmarks, generating, model_roles, rules_files
from stereolens.benchmark import wildcard_patterns
from stereolens.config import check_model_sources, check_models, validate_config
from stereolens.design.rounds import check as check_rounds
from stereolens.layout import GENERATION, REPORT, SHARED
from stereolens.models.registry import TINY_MEM_MB, load_registry
from stereolens.plan import check_ceiling, default_throughput
from stereolens.metrics.command import SIMULATE_SETTINGS
from stereolens.settings import settings_json
from stereolens.workflow_support import (
    check_results_intact,
    final_targets,
    housekeeping,
    job_timing_inputs,
    model_fingerprint_json,
    report_inputs,
    runs_no_job,
)

validate_config(config)
REGISTRY = load_registry(config["registry"])
check_models(config, REGISTRY)
# an adaptive config the rounds cannot run (stereolens.design.rounds.check, with its
# GPU-hours cap) and a run larger than its ceilings (limits: jobs, images, GPU-hours,
# counted at the cap's shards) are refused before any job list is built (the counts are
# arithmetic); once, in the main process (pricing a cap takes up to a second at paper
# scale; a job's own parse prices it only if its input functions need the rounds' sizes)
CHECKED_BUDGET = None
if workflow.is_main_process:
    CHECKED_BUDGET = check_rounds(config, REGISTRY, default_throughput())
    check_ceiling(config, REGISTRY, default_throughput(), CHECKED_BUDGET)
# a damaged table in results/ (a truncated parquet, a JSON-lines file cut mid-line) is
# refused before the DAG is built, naming it and the command that mends it; once, in the
# main process (a job's own parse skips it: the job checks its inputs itself)
if workflow.is_main_process:
    check_results_intact(workflow.overwrite_configfiles, warn_only=housekeeping())
    # a local model path that is missing or holds no model, an API key variable unset:
    # refused here, not in each job after the queue (an unset key only warns in a dry run)
    check_model_sources(config, REGISTRY, warn_keys=runs_no_job())


# the shared wildcards, then each benchmark's own (its plug-in's wildcards)
wildcard_constraints:
    **wildcard_patterns(),
    model=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    extractor=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    shard=r"[0-9]+",
    checkpoint=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    # generation (generate_images): the benchmarks that generate, a group, a cell
    benchmark="|".join(p.name for p in generating()),
    group=r"[a-z0-9_]+",
    cell=r"[A-Za-z0-9_-]+",


def preset_arg(section, keys):
    """The settings keys of a validated benchmark section as one shell-quoted JSON
    mapping, the --preset of the benchmark's metrics CLI (a change reruns the rule)."""
    return shlex.quote(settings_json(section, keys))


def layout(name):
    """The output paths of benchmark ``name`` (its plug-in's layout, stereolens.layout):
    ``layout(name).<template>`` is a pattern for a rule's output, and
    ``layout(name)("<template>", key=value)`` that pattern with those wildcards filled."""
    return benchmark_plugin(name).layout


def model_spec(name):
    return REGISTRY[name]


# ---- The model jobs of each benchmark: its plug-in's jobs(config), the enumeration the
# planner (stereolens.plan) and the job timings read too. The input functions that list
# model jobs (the merges' shards) select from it; nothing here enumerates jobs itself.


@lru_cache(maxsize=None)
def plugin_jobs(name):
    """The model jobs of benchmark ``name`` (its plug-in's jobs(config)), none when the
    config does not enable it; enumerated once per parse, when first asked for."""
    plugin = benchmark_plugin(name)
    return tuple(plugin.jobs(config)) if plugin.enabled(config) else ()


@lru_cache(maxsize=None)
def job_outputs(name, stage, *keys):
    """Outputs of benchmark ``name``'s model jobs of ``stage`` (generate, extract, vqa,
    ...), grouped by the values of their wildcards ``keys`` (in the plug-in's job order)."""
    out = {}
    for job in plugin_jobs(name):
        if job.stage == stage:
            out.setdefault(tuple(job.wildcards[k] for k in keys), []).append(job.output)
    return out


# Planning speed. The paper-scale run plans ~14,000 model jobs, and Snakemake calls every
# input function, param and resource callable of every job. Two things keep that cheap:
# per-model values are computed once per model (lru_cache), not once per job, and the
# callables of the per-job rules are marked with per_job, which gives Snakemake their
# signature once (it would otherwise run inspect.signature at every call: ~2 s of a
# paper-scale dry run).


def per_job(func):
    """Tell Snakemake the parameters of ``func`` once (snakemake.common's
    overwrite_function_params with the signature's own parameters: behaviour unchanged)."""
    overwrite_function_params(func, inspect.signature(func).parameters)
    return func


@lru_cache(maxsize=None)
def model_fingerprint(name):
    return model_fingerprint_json(REGISTRY[name])


@lru_cache(maxsize=None)
def model_gpu(name):
    """GPUs a job of this model asks for (stereolens.models.registry ModelSpec.job_gpus:
    a vLLM model its tensor_parallel_size, another 1 when it needs one, else 0)."""
    return REGISTRY[name].job_gpus()


def model_mem_mb(name, attempt):
    """Host memory of a model job on its attempt: registry mem_mb (or the backend's
    default) times the attempt, so an out-of-memory failure retries with more."""
    return REGISTRY[name].job_mem_mb(attempt)


def model_batch_size(name, attempt):
    """Batch size of a model job on its attempt: registry batch_size halved per retry."""
    return REGISTRY[name].job_batch_size(attempt)


# ---- check_models (workflow/rules/models.smk): one job per model, its first. Every job
# of a model takes the model's check table as an ancient() input, whether the check is
# on or off, so switching it on or off reruns nothing, and a rewritten table reruns no
# finished job. The check has no params: a table is written once per model, before the
# model's first job (a param that changed with the model's settings would rerun the
# check, and Snakemake skips the checked jobs' own rerun reasons in that invocation).

CHECK = config["check_models"]


def check_table(name):
    return SHARED("check", model=name)


def get_model_check(name):
    """The check table of registry entry ``name`` (nothing for None)."""
    return [ancient(check_table(name))] if name else []


@per_job
def get_extractor_check(wildcards):
    return get_model_check(wildcards.extractor)


def check_models_local():
    """Whether the checks run where Snakemake runs: off, or twins only (CPU, minutes)."""
    return not CHECK["enabled"] or CHECK["weights"] == "twin"


@lru_cache(maxsize=None)
def check_models_gpu(name):
    """1 when the check loads the model's own weights and they need a GPU (weights:
    auto, weights present locally), else 0 (twins run on the CPU)."""
    if check_models_local():
        return 0
    from stereolens.check_models import weights_present

    spec = REGISTRY[name]
    return spec.job_gpus() if weights_present(spec) else 0


@per_job
def get_check_gpu(wildcards):
    return check_models_gpu(wildcards.model)


@per_job
def get_check_mem_mb(wildcards):
    return check_models_mem_mb(wildcards.model)


def check_models_mem_mb(name):
    """Host memory of a check: the model's job memory when its own weights may load."""
    return TINY_MEM_MB if check_models_local() else REGISTRY[name].job_mem_mb()


def get_checkpoint(name):
    """A locally built checkpoint the model needs (embedded default), else nothing."""
    spec = REGISTRY[name]
    return [spec.model] if spec.get("build") else []


def get_tiny_builder(wildcards):
    path = f"resources/models/{wildcards.checkpoint}"
    builders = {s.get("build") for s in REGISTRY.values() if s.get("build") and s.model == path}
    if len(builders) != 1:
        raise ValueError(f"no single registry entry builds {path}: found {sorted(builders)}")
    return builders.pop()


@per_job
def get_extractor_checkpoint(wildcards):
    return get_checkpoint(wildcards.extractor)


def model_env(name):
    """Conda env of a job that runs a VLM or LLM: vLLM brings its own CUDA torch."""
    env = "vllm" if REGISTRY[name].backend == "vllm" else "extract"
    return os.path.join(workflow.basedir, "envs", f"{env}.yaml")


@per_job
def get_extractor_env(wildcards):
    return model_env(wildcards.extractor)


@per_job
def get_model_env(wildcards):
    return model_env(wildcards.model)


@per_job
def get_model_fingerprint(wildcards):
    return model_fingerprint(wildcards.model)


@per_job
def get_extractor_fingerprint(wildcards):
    return model_fingerprint(wildcards.extractor)


# Resources of the model jobs: the {model} wildcard's (generation, LVLM responses) and the
# {extractor} wildcard's (extraction, VQA).
@per_job
def get_model_checkpoint(wildcards):
    return get_checkpoint(wildcards.model)


@per_job
def get_models_checked(wildcards):
    return get_model_check(wildcards.model)


@per_job
def get_model_gpu(wildcards):
    return model_gpu(wildcards.model)


@per_job
def get_model_mem_mb(wildcards, attempt):
    return model_mem_mb(wildcards.model, attempt)


@per_job
def get_model_batch_size(wildcards, attempt):
    return model_batch_size(wildcards.model, attempt)


@per_job
def get_extractor_gpu(wildcards):
    return model_gpu(wildcards.extractor)


@per_job
def get_extractor_mem_mb(wildcards, attempt):
    return model_mem_mb(wildcards.extractor, attempt)


@per_job
def get_extractor_batch_size(wildcards, attempt):
    return model_batch_size(wildcards.extractor, attempt)


# The jobs that run one fixed registry entry (the canonicalisation LLM, the LVLM
# assistant and refusal judge; None: none configured).
def helper_checkpoint(name):
    return get_checkpoint(name) if name else []


def helper_gpu(name):
    return model_gpu(name) if name else 0


def helper_mem_mb(name, attempt):
    """A fixed model's job memory; none (phrase rules alone) needs little."""
    return model_mem_mb(name, attempt) if name else TINY_MEM_MB


def helper_batch_size(name, attempt):
    return model_batch_size(name, attempt) if name else 1


def helper_fingerprint(name):
    """Registry fingerprint of the assistant or the refusal judge ("none" when unset)."""
    return model_fingerprint(name) if name else "none"


def cpu_job_group(name, model):
    """Group of a model job on a cluster: the jobs of API and CPU models are small and
    many, so they join the group ``name`` where the profile batches it with
    group-components (profiles/slurm: several jobs per submission); a GPU model's jobs,
    and every job under a profile that does not batch ``name``, stay alone (None).
    Decided here, not in the profile, because one rule runs both kinds and a profile's
    `groups:` names a whole rule. Local runs ignore groups."""
    if model_gpu(model) or name not in workflow.group_settings.group_components:
        return None
    return name


@per_job
def get_extraction_group(wildcards):
    return cpu_job_group("cpu-extract", wildcards.extractor)


@per_job
def get_vqa_group(wildcards):
    return cpu_job_group("cpu-vqa", wildcards.extractor)


# ---- generation: generate_images (models.smk) generates for every benchmark whose
# plug-in has generation_items. A job is
# results/{benchmark}/images/{model}/{group}/{cell}/{shard}; the benchmark decides what
# group and cell are (ContextBias: role and condition; BiasIG: acquired attribute type and
# prompt condition), its prompt input and its settings param (its plug-in's
# generation_prompts and generation_settings).


@lru_cache(maxsize=None)
def generation_prompts(name):
    return benchmark_plugin(name).generation_prompts(config)


@lru_cache(maxsize=None)
def generation_settings(name, model, cell):
    return benchmark_plugin(name).generation_settings(config, model, cell)


@per_job
def get_generation_input(wildcards):
    """The benchmark's prompt input (ContextBias: the prompt bank; BiasIG: the prompt
    table) and, for the embedded default, the locally built checkpoint."""
    return {
        "prompts": generation_prompts(wildcards.benchmark),
        "checkpoint": get_checkpoint(wildcards.model),
        "models_checked": get_model_check(wildcards.model),
    }


@per_job
def get_generation_settings(wildcards):
    """What decides a shard's images besides the model, per benchmark (a Snakemake param:
    a change reruns the affected jobs). The values are those the benchmarks' own rules had,
    so finished shards of earlier runs stay up to date."""
    return generation_settings(wildcards.benchmark, wildcards.model, wildcards.cell)


def get_report_config():
    """The config as the report shows it, with the model lists whose order changes no
    result sorted (each plug-in's unordered_models), so that reordering them does not
    rerun the report."""
    import copy

    shown = copy.deepcopy(config)
    # the run-size ceilings and the planner's settings change no result: a finished
    # run's report stays up to date
    shown.pop("limits", None)
    shown.pop("design", None)
    for plugin in benchmarks():
        for key in plugin.unordered_models:
            if key in shown.get(plugin.name, {}):
                shown[plugin.name][key] = sorted(shown[plugin.name][key])
    return shown


def get_report_models():
    """name -> kind and fingerprint of every model the run uses, for the report's Models
    table and tiny-model warning: a param, so a change to those models' entries rebuilds
    the report and an edit of any other registry entry does not."""
    names = sorted({name for _, name in model_roles(config)} & set(REGISTRY))
    return {n: {"kind": REGISTRY[n].kind, "fingerprint": REGISTRY[n].fingerprint()} for n in names}


def get_report_inputs(wildcards):
    """Every file the report reads, by the names stereolens.report.inputs reads: the report
    tables of every benchmark the config enables (their plug-ins' report_tables), the run's
    job timings and the planner's throughput table (stereolens.workflow_support.report_inputs;
    the registry entries of the run's models are a param, get_report_models)."""
    return report_inputs(config)


def get_job_timing_inputs(wildcards):
    """The outputs of every model job of the run (generation shard folders, extraction,
    VQA, LVLM response and story-attribute files), from the plug-ins' job enumeration
    (stereolens.workflow_support.job_timing_inputs): the job timings are read from them and
    from the timing records, benchmark files and logs their jobs write beside them."""
    # in rounds (design.mode adaptive) the jobs the rounds made (workflow/rules/adaptive.smk)
    return job_timing_inputs(config, run_jobs)


def get_final_targets():
    """The inputs of rule all, from stereolens.workflow_support.final_targets (the targets
    of every benchmark the config enables, from their plug-ins, then the report)."""
    return final_targets(config)


def get_metrics_dir(wildcards, output):
    """The folder a metrics CLI's --out writes its tables to: that of the rule's first
    output (every metrics rule's outputs share one folder)."""
    return os.path.dirname(output[0])


def get_benchmark_rules():
    """The rules files of every registered benchmark (their plug-ins' rules), for the
    Snakefile's includes: a relative path is the workflow folder's, an absolute one a file
    shipped in the benchmark's package."""
    return rules_files()
