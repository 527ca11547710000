"""The roles of the models a run uses, from its config alone (cheap to import: the
workflow calls it at parse time)."""

from __future__ import annotations


def model_roles(config: dict) -> list[tuple[str, str]]:
    """(role, registry name) of every model the config runs, in report order."""
    cb = config.get("contextbias") or {}
    bg = config.get("biasig") or {}
    lv = config.get("lvlm") or {}
    canon = cb.get("canonicalisation") or {}
    out: list[tuple[str, str]] = []
    out += [("contextbias generator", n) for n in cb.get("generators") or []]
    out += [("contextbias extractor", n) for n in cb.get("extractors") or []]
    if canon.get("enabled") and canon.get("llm"):
        out.append(("contextbias canonicalisation LLM", canon["llm"]))
    if bg.get("enabled"):
        out += [("biasig generator", n) for n in bg.get("generators") or []]
        if bg.get("vqa"):
            out.append(("biasig VQA", bg["vqa"]))
    if lv.get("enabled"):
        out += [("lvlm audited model", n) for n in lv.get("models") or []]
        if lv.get("assistant"):
            out.append(("lvlm assistant (story attributes, term judge)", lv["assistant"]))
        if lv.get("refusal_judge"):
            out.append(("lvlm refusal judge", lv["refusal_judge"]))
    return out
