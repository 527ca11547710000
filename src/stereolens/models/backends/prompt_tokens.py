"""Which of a pipeline's text encoders cut a prompt, and by how many tokens (recorded in the
image's metadata; docs/twins.md). Imports nothing heavy: the pipeline is passed in."""

from __future__ import annotations

import inspect
from typing import Any

TOKENIZERS = ("tokenizer", "tokenizer_2", "tokenizer_3")
"""Attributes of a diffusers pipeline that may hold a text encoder's tokenizer."""
QUIRK = "prompt_truncated"
"""The quirk an image whose prompt a text encoder cut carries in its metadata."""
_SANE = 100_000
"""A tokenizer's model_max_length above this is transformers' "no limit" placeholder."""


def _call_default(pipe: Any, name: str) -> Any:
    try:
        param = inspect.signature(type(pipe).__call__).parameters.get(name)
    except (TypeError, ValueError):
        return None
    if param is None or param.default is inspect.Parameter.empty:
        return None
    return param.default


def token_limits(pipe: Any, call_kwargs: dict[str, Any]) -> list[tuple[str, Any, int]]:
    """(attribute, tokenizer, tokens kept) of each text encoder of ``pipe`` that cuts
    prompts: CLIP tokenizers at their ``model_max_length``, T5 tokenizers at the call's
    ``max_sequence_length`` (``call_kwargs``, else the pipeline's default)."""
    out = []
    for attr in TOKENIZERS:
        tok = getattr(pipe, attr, None)
        if tok is None:
            continue
        kind = type(tok).__name__
        if "CLIP" in kind:
            limit = getattr(tok, "model_max_length", None)
        elif "T5" in kind:
            limit = call_kwargs.get("max_sequence_length") or _call_default(
                pipe, "max_sequence_length"
            )
            limit = limit or getattr(tok, "model_max_length", None)
        else:
            continue
        if isinstance(limit, int) and 0 < limit < _SANE:
            out.append((attr, tok, limit))
    return out


def prompt_truncation(limits: list[tuple[str, Any, int]], prompt: str) -> list[dict[str, Any]]:
    """One entry per text encoder that cuts ``prompt`` (empty = none does): encoder (the
    pipeline's tokenizer attribute), tokenizer (its class), limit, tokens (the whole
    prompt's, special tokens included), kept, dropped."""
    cut = []
    for attr, tok, limit in limits:
        ids = tok(prompt, truncation=False, add_special_tokens=True, verbose=False)["input_ids"]
        if len(ids) > limit:
            cut.append(
                {
                    "encoder": attr,
                    "tokenizer": type(tok).__name__,
                    "limit": limit,
                    "tokens": len(ids),
                    "kept": limit,
                    "dropped": len(ids) - limit,
                }
            )
    return cut
