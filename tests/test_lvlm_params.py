"""The LVLM rules' params (stereolens.lvlm.params): each job reads only what its params hold,
and the JSON of the params is the one the rules had (a finished run stays up to date)."""

import json
from pathlib import Path

from stereolens.config import validate_config
from stereolens.lvlm import params as P
from stereolens.validation import load_yaml

ROOT = Path(__file__).resolve().parents[1]


def _lv():
    return validate_config(load_yaml(ROOT / "config" / "config.yaml", "config"))["lvlm"]


def test_task_settings_hold_what_each_task_reads():
    lv = _lv()
    story, term, exam = (json.loads(P.task_settings(lv, t)) for t in ("story", "term", "exam"))
    common = {"seed", "max_attempts", "mitigation_placement", "prompts", "terms", "max_new_tokens"}
    assert set(story) == common
    assert set(term) == common | {"terms_per_domain"}
    assert set(exam) == common | {"questions_per_subject", "mmlu"}
    assert exam["max_new_tokens"] == lv["tasks"]["exam"]["max_new_tokens"]


def test_story_sample_job_sees_exactly_its_param():
    lv = _lv()
    settings = P.story_sample_settings(lv)
    # the rule's former param: a JSON list of these values in this order
    keys = ("seed", "max_attempts", "prompts", "assistant_max_new_tokens", "story_reading")
    assert json.loads(settings) == [*(lv[k] for k in keys), lv["axes"], lv["groups"]]
    seen = P.story_sample_config(settings)
    assert seen == {k: lv[k] for k in P.STORY_SAMPLE_KEYS}
    assert "tasks" not in seen  # what is not a param, the job does not read


def test_refusal_settings_follow_the_judge():
    lv = _lv()
    assert json.loads(P.refusal_settings({**lv, "refusal_judge": None})) == {
        "phrases": lv["refusal_phrases"]
    }
    judged = json.loads(P.refusal_settings({**lv, "refusal_judge": "x"}))
    assert judged == {
        "phrases": lv["refusal_phrases"],
        "seed": lv["seed"],
        "prompts": lv["prompts"],
    }


def test_user_image_paths():
    lv = _lv()
    synthetic = {**lv, "user_images": {**lv["user_images"], "source": "synthetic"}}
    assert P.image_folder(synthetic) == "results/lvlm/user_images/synthetic"
    assert P.labels_csv(synthetic) == "results/lvlm/user_images/synthetic/labels.csv"
    folder = {
        **lv,
        "user_images": {
            **lv["user_images"],
            "source": "folder",
            "folder": "f",
            "labels_csv": "l.csv",
        },
    }
    assert (P.image_folder(folder), P.labels_csv(folder)) == ("f", "l.csv")
    assert P.prompt_file({**lv, "prompts": "p.yaml"}) == "p.yaml"
    assert P.prompt_file({**lv, "prompts": None}).endswith("prompts.v1.yaml")
