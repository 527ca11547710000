"""The ContextBench prompt bank as a table, with the source quirks handled (docs/data.md)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from stereolens.ids import stable_id
from stereolens.paths import resource
from stereolens.validation import ConfigError

CONDITIONS = ("CF", "CA-R", "CA-U")
PHRASINGS = (
    "a photo of a",
    "a photograph of a",
    "a realistic image of a",
    "a realistic photo of a",
)
BANK_KEY_ALIASES = {"SD3.5": "3.5"}

_CHANGED = re.compile(r"\s+changed$")
_CAF = re.compile(r"\bcaf\b")
_ARTICLE = re.compile(r"\ba (?=[aeiouAEIOU])")


def bank_roles(bank_path: str | None) -> list[str]:
    """Roles of a prompt bank, in bank order (the shipped roles.json when bank_path is None)."""
    if bank_path is None:
        return json.loads(resource("contextbias", "roles.json").read_text())
    bank = json.loads(Path(bank_path).read_text())
    return list(dict.fromkeys(e["role"] for e in bank))


def clean_text(raw: str, fix_articles: bool = False) -> tuple[str, list[str]]:
    """The generation prompt for a bank entry, and the quirks that were handled."""
    quirks: list[str] = []
    text = " ".join(raw.split())
    if _CHANGED.search(text):
        text = _CHANGED.sub("", text)
        quirks.append("changed_suffix_removed")
    if _CAF.search(text):
        text = _CAF.sub("café", text)
        quirks.append("cafe_accent_restored")
    if _ARTICLE.search(text):
        if fix_articles:
            text = _ARTICLE.sub("an ", text)
            quirks.append("article_fixed")
        else:
            quirks.append("article_not_adjusted")
    return text, quirks


def derived_seeds(prompt_id: str, model: str, n: int, avoid: Sequence[int] = ()) -> list[int]:
    """Seeds for a prompt that the bank has none for: stable, distinct, < 2**31, none of
    them in ``avoid``."""
    seeds: list[int] = []
    used = set(avoid)
    i = 0
    while len(seeds) < n:
        s = int(stable_id("seed", prompt_id, model, i), 16) % (2**31)
        if s not in used:
            used.add(s)
            seeds.append(s)
        i += 1
    return seeds


def load_bank(path: str | os.PathLike | None = None) -> list[dict]:
    path = Path(path) if path else resource("contextbias", "prompts.json")
    try:
        bank = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"prompt bank {path} cannot be read as JSON: {exc}") from exc
    if not isinstance(bank, list):
        raise ConfigError(f"prompt bank {path}: expected a JSON list of entries")
    for i, entry in enumerate(bank):
        missing = {"role", "context", "prompt"} - set(entry)
        if missing:
            raise ConfigError(f"prompt bank {path}: entry {i} lacks {sorted(missing)}")
        if entry["context"] not in CONDITIONS:
            raise ConfigError(
                f"prompt bank {path}: entry {i} has context "
                f"{entry['context']!r}; allowed: {', '.join(CONDITIONS)}"
            )
    return bank


def build_prompts(
    models: list[str],
    seeds_per_prompt: int,
    bank_keys: dict[str, str] | None = None,
    default_bank_key: str | None = None,
    roles: list[str] | None = None,
    bank_path: str | os.PathLike | None = None,
    fix_articles: bool = False,
) -> pl.DataFrame:
    """One row per prompt: prompt_id, role, condition, variant, phrasing, template, text,
    raw_text, quirks, and per model the seeds (struct column ``seeds``) and where they
    came from (struct column ``seed_source``: bank key, or "derived")."""
    bank = load_bank(bank_path)
    bank_keys = bank_keys or {}
    wanted = set(roles) if roles else None
    if wanted:
        unknown = wanted - {e["role"] for e in bank}
        if unknown:
            raise ConfigError(
                f"contextbias.roles names roles not in the prompt bank: {sorted(unknown)}"
            )
    rows = []
    for entry in bank:
        role = entry["role"]
        if wanted and role not in wanted:
            continue
        text, quirks = clean_text(entry["prompt"], fix_articles)
        role_words = role.replace("_", " ")
        phrasing = next(
            (p for p in sorted(PHRASINGS, key=len, reverse=True) if text.startswith(p + " ")), None
        )
        if phrasing is None:
            raise ConfigError(f"prompt bank entry {entry['prompt']!r}: unknown phrasing")
        if entry["context"] == "CA-R" and text in (f"{p} {role_words}" for p in PHRASINGS):
            quirks.append("ca_r_without_context")
        template = text.replace(role_words, "{role}", 1)
        prompt_id = stable_id(role, entry["context"], text)
        bank_seeds = {
            BANK_KEY_ALIASES.get(k, k): v for k, v in (entry.get("seeds_by_model") or {}).items()
        }
        seeds, sources = {}, {}
        for model in models:
            key = bank_keys.get(model, default_bank_key)
            chosen = bank_seeds.get(key) if key else None
            if chosen is None and default_bank_key:
                key, chosen = default_bank_key, bank_seeds.get(default_bank_key)
            if chosen is None:
                # the bank lacks this model for this entry (PROVENANCE quirk 7):
                # fall back to any bank seeds, in a fixed key order, then derived ones
                key = next((k for k in sorted(bank_seeds) if k != "mmbd_eval"), None)
                chosen = bank_seeds.get(key) if key else None
            if chosen is None or len(chosen) < seeds_per_prompt:
                seeds[model] = derived_seeds(prompt_id, model, seeds_per_prompt)
                sources[model] = "derived"
            else:
                seeds[model] = [int(s) for s in chosen[:seeds_per_prompt]]
                sources[model] = f"bank:{key}"
        rows.append(
            {
                "prompt_id": prompt_id,
                "role": role,
                "condition": entry["context"],
                "variant": "substitution" if "changed_suffix_removed" in quirks else "phrasing",
                "phrasing": phrasing,
                "template": template,
                "text": text,
                "raw_text": entry["prompt"],
                "quirks": quirks,
                "seeds": seeds,
                "seed_source": sources,
            }
        )
    if not rows:
        raise ConfigError("no prompts selected: check contextbias.roles")
    frame = pl.DataFrame(rows)
    dupes = frame.filter(pl.col("prompt_id").is_duplicated())
    if dupes.height:
        raise ConfigError(
            f"prompt bank has duplicate (role, condition, text): {dupes['text'].head(3).to_list()}"
        )
    return frame.sort("role", "condition", "prompt_id")


def shard_items(
    prompts: pl.DataFrame, model: str, role: str, condition: str, shard: int, seeds_per_shard: int
) -> list[dict]:
    """The images of one generation job: every prompt of (role, condition) times the
    seed indices [shard * seeds_per_shard, (shard + 1) * seeds_per_shard)."""
    sel = prompts.filter((pl.col("role") == role) & (pl.col("condition") == condition))
    items = []
    lo, hi = shard * seeds_per_shard, (shard + 1) * seeds_per_shard
    for row in sel.select("prompt_id", "text", "variant", "seeds").iter_rows(named=True):
        for seed_index, seed in enumerate(row["seeds"][model][lo:hi], start=lo):
            items.append(
                {
                    "image_id": stable_id(model, row["prompt_id"], seed),
                    "prompt_id": row["prompt_id"],
                    "text": row["text"],
                    "seed": int(seed),
                    "extra": {
                        "role": role,
                        "condition": condition,
                        "variant": row["variant"],
                        "seed_index": seed_index,
                    },
                }
            )
    return items


ROLE_PATTERN = r"[a-z0-9_]{1,64}"
"""Role names name folders (results/contextbias/images/{model}/{role}/...) and wildcards."""


def role_slug(name: str) -> str:
    """A role name that fits ROLE_PATTERN, to suggest when one does not."""
    import unicodedata

    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "_", ascii_name.lower()).strip("_")[:64] or "role"


def check_prompt_bank(config: dict[str, Any]) -> list[str]:
    """The ContextBias roles of this run, checked at parse time (before any job is queued):
    the bank reads, every configured role is in it, every role name can name a folder,
    and every role has at least one non-empty prompt in every configured condition.
    Returns the roles; raises ConfigError naming the file, the role and what to do."""
    import difflib

    cb = config["contextbias"]
    path = cb["prompt_bank"] or "the shipped prompt bank"  # null: the shipped copy
    bank = load_bank(cb["prompt_bank"])
    bank_roles = list(dict.fromkeys(e["role"] for e in bank))
    roles = cb["roles"] or bank_roles  # null: every role
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
    conditions = cb["conditions"]
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
