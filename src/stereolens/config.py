"""Loading and checking a run config (the same checks the Snakefile runs)."""

from __future__ import annotations

import copy
import os
from typing import Any

from stereolens.models.registry import ModelSpec, load_registry
from stereolens.paths import resource
from stereolens.validation import ConfigError, load_yaml, validate_against

CONFIG_SCHEMA = resource("schemas", "config.schema.yaml")


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Validate in place, filling defaults; raise ConfigError naming the key."""
    validate_against(config, CONFIG_SCHEMA, what="config", fill_defaults=True)
    # defaults of nested objects that were absent are filled only one level deep
    # by the validator: run it again so their own defaults are filled too
    validate_against(config, CONFIG_SCHEMA, what="config", fill_defaults=True)
    return config


def check_models(config: dict[str, Any], registry: dict[str, ModelSpec]) -> None:
    """Every model the config names exists in the registry with the right kind."""
    cb = config["contextbias"]
    for key, kind in (("generators", "generator"), ("extractors", "vlm")):
        for name in cb[key]:
            spec = registry.get(name)
            if spec is None:
                known = sorted(n for n, s in registry.items() if s.kind == kind)
                raise ConfigError(
                    f"contextbias.{key}: {name!r} is not in the registry "
                    f"{config['registry']}; known {kind}s: {', '.join(known)}. "
                    "Add an entry there to add a model."
                )
            if spec.kind != kind:
                raise ConfigError(
                    f"contextbias.{key}: {name!r} is a {spec.kind} in the registry, not a {kind}"
                )
    bg = config["biasig"]
    if bg["enabled"]:
        for name in bg["generators"]:
            if registry.get(name) is None or registry[name].kind != "generator":
                raise ConfigError(
                    f"biasig.generators: {name!r} is not a generator in the registry "
                    f"{config['registry']}"
                )
        if (
            bg["vqa"] is None
            or registry.get(bg["vqa"]) is None
            or registry[bg["vqa"]].kind != "vlm"
        ):
            raise ConfigError(
                f"biasig.vqa: {bg['vqa']!r} is not a vlm in the registry {config['registry']}"
            )
    _check_lvlm(config, registry)
    llm = cb["canonicalisation"]["llm"]
    if llm is not None and (llm not in registry or registry[llm].kind not in ("llm", "vlm")):
        known = sorted(n for n, s in registry.items() if s.kind == "llm")
        raise ConfigError(
            f"contextbias.canonicalisation.llm: {llm!r} is not an llm in the registry "
            f"{config['registry']}; known llms: {', '.join(known)}"
        )


def _check_lvlm(config: dict[str, Any], registry: dict[str, ModelSpec]) -> None:
    lv = config.get("lvlm") or {}
    if not lv.get("enabled"):
        return
    where = config["registry"]
    if not lv["models"]:
        raise ConfigError("lvlm.models is empty: name at least one vlm of the registry")
    for name in lv["models"]:
        if registry.get(name) is None or registry[name].kind != "vlm":
            known = sorted(n for n, s in registry.items() if s.kind == "vlm")
            raise ConfigError(
                f"lvlm.models: {name!r} is not a vlm in the registry {where}; known vlms: "
                f"{', '.join(known)}. Add an entry under vlms: to add a model."
            )
    needs_assistant = [t for t in ("story", "term") if t in lv["tasks"]]
    if needs_assistant and lv["assistant"] is None:
        raise ConfigError(
            f"lvlm.assistant is null but task(s) {', '.join(needs_assistant)} need the LLM "
            "assistant: name an llms (or vlms) entry of the registry"
        )
    for key in ("assistant", "refusal_judge"):
        name = lv[key]
        if name is not None and (name not in registry or registry[name].kind not in ("llm", "vlm")):
            raise ConfigError(f"lvlm.{key}: {name!r} is not an llm or vlm in the registry {where}")
    src = lv["user_images"]
    if src["source"] == "folder" and not src["folder"]:
        raise ConfigError("lvlm.user_images.source is folder but lvlm.user_images.folder is unset")
    if "attribute_inferring" in lv["tasks"] and lv["settings"] == ["persona"]:
        raise ConfigError(
            "lvlm.tasks.attribute_inferring asks about the photo: it needs the image or "
            "mitigation setting, not persona alone"
        )


def load_config(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, ModelSpec]]:
    config = load_yaml(path, "config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"config {path}: expected a mapping of keys at the top level")
    config = validate_config(copy.deepcopy(config))
    registry = load_registry(config["registry"])
    check_models(config, registry)
    check_prompt_bank(config)
    return config, registry


ROLE_PATTERN = r"[a-z0-9_]{1,64}"
"""Role names name folders (results/contextbias/images/{model}/{role}/...) and wildcards."""


def role_slug(name: str) -> str:
    """A role name that fits ROLE_PATTERN, to suggest when one does not."""
    import re
    import unicodedata

    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "_", ascii_name.lower()).strip("_")[:64] or "role"


def check_prompt_bank(config: dict[str, Any]) -> list[str]:
    """The ContextBias roles of this run, checked at parse time (before any job is queued):
    the bank reads, every configured role is in it, every role name can name a folder,
    and every role has at least one non-empty prompt in every configured condition.
    Returns the roles; raises ConfigError naming the file, the role and what to do."""
    import difflib
    import re

    from stereolens.contextbias.prompts import load_bank

    cb = config["contextbias"]
    path = cb.get("prompt_bank") or "the shipped prompt bank"
    bank = load_bank(cb.get("prompt_bank"))
    bank_roles = list(dict.fromkeys(e["role"] for e in bank))
    roles = cb.get("roles") or bank_roles
    unknown = [r for r in roles if r not in bank_roles]
    if unknown:
        hints = []
        for r in unknown[:5]:
            close = difflib.get_close_matches(r, bank_roles, n=2)
            hints.append(f"{r!r}" + (f" (did you mean {' or '.join(close)}?)" if close else ""))
        raise ConfigError(
            f"contextbias.roles names role(s) not in {path}: {', '.join(hints)}; the bank has "
            f"{len(bank_roles)} roles (e.g. {', '.join(bank_roles[:5])})"
        )
    bad = [r for r in roles if not re.fullmatch(ROLE_PATTERN, r)]
    if bad:
        raise ConfigError(
            f"{path}: role name(s) {', '.join(repr(r) for r in bad[:5])} cannot name a folder: "
            "role names must be lowercase ASCII letters, digits and underscores, at most 64 "
            f"characters; rename them in the bank (e.g. {role_slug(bad[0])!r})"
        )
    conditions = cb.get("conditions") or []
    have: dict[tuple[str, str], int] = {}
    for i, e in enumerate(bank):
        if not isinstance(e.get("prompt"), str) or not e["prompt"].strip():
            raise ConfigError(f"{path}: entry {i} (role {e.get('role')!r}) has an empty prompt")
        have[(e["role"], e["context"])] = have.get((e["role"], e["context"]), 0) + 1
    missing = [(r, c) for r in roles for c in conditions if not have.get((r, c))]
    if missing:
        shown = ", ".join(f"{r} {c}" for r, c in missing[:5])
        raise ConfigError(
            f"{path}: no prompt for {shown}"
            + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
            + "; every role needs prompts in every condition of contextbias.conditions: add "
            "them to the bank, or leave the role out of contextbias.roles"
        )
    return roles
