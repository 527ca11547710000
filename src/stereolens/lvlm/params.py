"""What decides each LVLM rule's result, from the config: the files its rules read and the
canonical JSON of their settings params (so a change reruns exactly the jobs it affects)."""

from __future__ import annotations

import json
import os


def image_folder(lv: dict) -> str:
    """The folder of the user photos the sets are drawn from."""
    src = lv["user_images"]
    if src["source"] == "synthetic":
        from stereolens.lvlm.layout import LAYOUT

        return LAYOUT.synthetic_faces
    if src["source"] == "huggingface":
        return "resources/lvlm/huggingface"
    return src["folder"]


def labels_csv(lv: dict) -> str:
    src = lv["user_images"]
    if src["source"] == "folder" and src["labels_csv"]:
        return src["labels_csv"]
    return os.path.join(image_folder(lv), "labels.csv")


def prompt_file(lv: dict) -> str:
    from stereolens.paths import resource

    return lv["prompts"] or str(resource("lvlm", "prompts.v1.yaml"))


def story_reading_sample(lv: dict) -> str:
    from stereolens.paths import resource

    return lv["story_reading"]["sample"] or str(resource("lvlm", "story_reading.v1.yaml"))


def draw_settings(lv: dict) -> str:
    """What decides the image draw; a change here redraws (and so reasks) every model."""
    keys = ("axes", "groups", "seed", "tasks", "user_images")
    return json.dumps({k: lv[k] for k in keys}, sort_keys=True)


def task_settings(lv: dict, task: str) -> str:
    """What decides a task's requests besides the model and the drawn images."""
    keys = ("seed", "max_attempts", "mitigation_placement", "prompts", "terms")
    keys += ("terms_per_domain",) if task == "term" else ()
    keys += ("questions_per_subject", "mmlu") if task == "exam" else ()
    settings = {k: lv[k] for k in keys}
    settings["max_new_tokens"] = lv["tasks"][task]["max_new_tokens"]
    return json.dumps(settings, sort_keys=True)


def story_settings(lv: dict) -> str:
    """What decides the assistant's story readings besides the assistant and the stories."""
    keys = ("seed", "max_attempts", "prompts")
    return json.dumps(
        {**{k: lv[k] for k in keys}, "max_new_tokens": lv["assistant_max_new_tokens"]},
        sort_keys=True,
    )


def judge_settings(lv: dict) -> str:
    """What decides the term judgements besides the assistant and the explanations."""
    return json.dumps({k: lv[k] for k in ("seed", "max_attempts", "prompts")}, sort_keys=True)


def refusal_settings(lv: dict) -> str:
    """What decides the refusal labels: the phrase rules, and with a judge its seed and
    prompts."""
    settings = {"phrases": lv["refusal_phrases"]}
    if lv["refusal_judge"]:
        settings |= {"seed": lv["seed"], "prompts": lv["prompts"]}
    return json.dumps(settings, sort_keys=True)


STORY_SAMPLE_KEYS = (
    "seed",
    "max_attempts",
    "prompts",
    "assistant_max_new_tokens",
    "story_reading",
    "axes",
    "groups",
)
"""The lvlm keys the story-sample reading job reads (rule read_lvlm_story_sample)."""


def story_sample_settings(lv: dict) -> str:
    """What decides the assistant's readings of the labelled story sample besides the
    assistant and the sample: the values of :data:`STORY_SAMPLE_KEYS`, in that order."""
    return json.dumps([lv[k] for k in STORY_SAMPLE_KEYS])


def story_sample_config(settings: str) -> dict:
    """The lvlm config section the reading job sees: :func:`story_sample_settings` read
    back (so the job reads nothing that is not its param)."""
    return dict(zip(STORY_SAMPLE_KEYS, json.loads(settings), strict=True))
