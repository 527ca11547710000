"""Local vision-language models through Hugging Face transformers (CPU or GPU), with output
constrained by an xgrammar logits processor (:class:`GrammarConstrainedGeneration`, shared with
the text-only backend; docs/adding-a-model.md, "The backends in detail")."""

from __future__ import annotations

import json
import logging
from typing import Any

from stereolens.images import ImageUnreadable, load_image
from stereolens.models.ask import BackendFailure, ItemFailure, out_of_memory_errors
from stereolens.models.backends import resolve_device
from stereolens.models.registry import ModelSpec, resolve_model_location
from stereolens.models.requests import VLMRequest

logger = logging.getLogger(__name__)

_DTYPES = {"float32", "float16", "bfloat16"}


def _resolve_dtype(name: str | None):
    import torch

    if name in (None, "auto"):
        return "auto"
    if name not in _DTYPES:
        raise ValueError(f"dtype {name!r} is not one of {sorted(_DTYPES)} or 'auto'")
    return getattr(torch, name)


def choice_grammar(choices: tuple[str, ...] | list[str]) -> str:
    """EBNF (xgrammar dialect) that matches exactly one of ``choices``."""
    if not choices:
        raise ValueError("choices must not be empty")
    # JSON string literals use the escapes the EBNF parser understands (\" \\ \n \uXXXX).
    alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
    return f"root ::= {alternatives}\n"


def _grammar_logits_processor_class():
    """Build the logits-processor class lazily, so importing this module needs no torch."""
    import torch
    import xgrammar as xgr
    from transformers import LogitsProcessor

    class GrammarLogitsProcessor(LogitsProcessor):
        """Masks each row's logits to the tokens its grammar allows (None = free text); one
        instance per ``generate`` call, a matcher per row fed the previous step's token."""

        def __init__(self, grammars: list[Any], vocab_size: int):
            self.matchers = [xgr.GrammarMatcher(g) if g is not None else None for g in grammars]
            self.bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
            self.vocab_size = vocab_size
            self.started = False
            self.broken = [False] * len(grammars)

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor):
            if self.started:
                for i, m in enumerate(self.matchers):
                    if m is None or self.broken[i] or m.is_terminated():
                        continue
                    token = int(input_ids[i, -1])
                    if not m.accept_token(token):
                        # Cannot happen when the mask was applied; never crash the batch.
                        logger.warning(
                            "grammar rejected token %d in row %d; row unconstrained", token, i
                        )
                        self.broken[i] = True
            self.started = True
            rows = [
                i
                for i, m in enumerate(self.matchers)
                if m is not None and not self.broken[i] and not m.is_terminated()
            ]
            if not rows:
                return scores
            for i in rows:
                self.matchers[i].fill_next_token_bitmask(self.bitmask, i)
            if scores.device.type in ("cpu", "cuda"):
                xgr.apply_token_bitmask_inplace(
                    scores,
                    self.bitmask.to(scores.device),
                    vocab_size=self.vocab_size,
                    indices=rows,
                )
                return scores
            masked = scores.to("cpu")  # other devices: mask on the CPU
            xgr.apply_token_bitmask_inplace(
                masked, self.bitmask, vocab_size=self.vocab_size, indices=rows
            )
            return masked.to(scores.device)

    return GrammarLogitsProcessor


class GrammarConstrainedGeneration:
    """Batched greedy / seeded generation under an xgrammar constraint, shared by the local
    transformers backends. A subclass sets ``spec``, ``batch_size``, ``model`` and
    ``tokenizer`` (left padding), calls :meth:`_setup_decoding` and implements
    :meth:`_encode` (a chunk of requests as model inputs on the model's device)."""

    backend_label = "transformers"
    """Name used in log messages."""

    spec: ModelSpec
    model: Any
    tokenizer: Any
    batch_size: int

    def _setup_decoding(self) -> None:
        """Stop and pad tokens, and the grammar compiler for the model's vocabulary."""
        import torch
        import xgrammar as xgr

        spec = self.spec
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self.stop_token_ids = [
            int(t) for t in (eos if isinstance(eos, list) else [eos]) if t is not None
        ]
        if not self.stop_token_ids:
            raise ValueError(f"{spec.model}: no eos token in the generation config or tokenizer")
        pad = gen.pad_token_id if gen.pad_token_id is not None else self.tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else self.stop_token_ids[0]
        # The token mask must cover the lm_head, which is often padded past the tokenizer.
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
        )
        self._compiler = xgr.GrammarCompiler(
            tokenizer_info, max_threads=max(1, min(8, torch.get_num_threads()))
        )
        self._grammars: dict[str, Any] = {}
        self._processor_class = _grammar_logits_processor_class()

    # ---------------------------------------------------------------- grammars
    def grammar(self, request: VLMRequest):
        """Compiled grammar for a request's constraint (cached), or None for free text."""
        if request.json_schema is not None:
            key = "json:" + json.dumps(request.json_schema, sort_keys=True)
            if key not in self._grammars:
                # Compact JSON: no free whitespace, so a constrained answer stays finite.
                self._grammars[key] = self._compiler.compile_json_schema(
                    request.json_schema, any_whitespace=False, strict_mode=True
                )
        elif request.choices is not None:
            key = "choice:" + json.dumps(list(request.choices))
            if key not in self._grammars:
                self._grammars[key] = self._compiler.compile_grammar(
                    choice_grammar(request.choices)
                )
        else:
            return None
        return self._grammars[key]

    # ---------------------------------------------------------------- generation
    def _encode(self, requests: list[VLMRequest]):
        """Model inputs (input_ids, attention_mask, ...) for a chunk, on the model's device."""
        raise NotImplementedError

    def _generate(self, requests: list[VLMRequest]) -> list[str]:
        import torch
        from transformers import LogitsProcessorList

        inputs = self._encode(requests)
        grammars = [self.grammar(r) for r in requests]
        processors = LogitsProcessorList()
        if any(g is not None for g in grammars):
            processors.append(self._processor_class(grammars, self.vocab_size))

        first = requests[0]
        sample = first.temperature > 0
        kwargs: dict[str, Any] = {
            "max_new_tokens": first.max_new_tokens,
            "do_sample": sample,
            "repetition_penalty": 1.0,  # not the checkpoint's default: plain greedy/sampling
            "eos_token_id": self.stop_token_ids,
            "pad_token_id": self.pad_token_id,
            "logits_processor": processors,
        }
        if sample:
            kwargs.update(temperature=first.temperature, top_p=1.0, top_k=0)
        devices = [torch.cuda.current_device()] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            if sample and first.seed is not None:
                torch.manual_seed(first.seed)
            sequences = self.model.generate(**inputs, **kwargs)
        new_tokens = sequences[:, inputs["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)

    def _chunks(self, requests: list[VLMRequest]) -> list[list[int]]:
        """Indices grouped for one generate call: greedy requests with the same
        max_new_tokens, up to batch_size; each sampled request alone (own seed)."""
        chunks: list[list[int]] = []
        for i, r in enumerate(requests):
            if chunks and r.temperature == 0:
                last = chunks[-1]
                head = requests[last[0]]
                if (
                    head.temperature == 0
                    and head.max_new_tokens == r.max_new_tokens
                    and len(last) < self.batch_size
                ):
                    last.append(i)
                    continue
            chunks.append([i])
        return chunks

    def answer(self, requests: list[VLMRequest]) -> list[str | ItemFailure]:
        """One raw text per request. A failed batch is asked again one request at a time;
        then an undecodable image is its item's ItemFailure, out of memory is raised as it
        is (Snakemake retries the job), and any other error fails the job (BackendFailure)."""
        out: list[str | ItemFailure] = [""] * len(requests)
        oom = out_of_memory_errors()
        for chunk in self._chunks(requests):
            try:
                for i, text in zip(
                    chunk, self._generate([requests[i] for i in chunk]), strict=True
                ):
                    out[i] = text
                continue
            except oom:
                if len(chunk) == 1:
                    raise
                logger.warning(
                    "%s backend %s: batch of %d ran out of memory; one at a time",
                    self.backend_label,
                    self.spec.name,
                    len(chunk),
                )
            except Exception as exc:
                if len(chunk) == 1:
                    out[chunk[0]] = self._failure(exc)
                    continue
                logger.warning(
                    "%s backend %s: batch of %d failed (%s); retrying one at a time",
                    self.backend_label,
                    self.spec.name,
                    len(chunk),
                    exc,
                )
            for i in chunk:
                try:
                    out[i] = self._generate([requests[i]])[0]
                except oom:
                    raise
                except Exception as exc:
                    out[i] = self._failure(exc)
        return out

    def _failure(self, exc: Exception) -> ItemFailure:
        """An unreadable image is the item's own failure; anything else fails the job."""
        if isinstance(exc, ImageUnreadable):
            logger.error("%s backend %s: %s", self.backend_label, self.spec.name, exc)
            return ItemFailure(str(exc))
        raise BackendFailure(
            f"{self.backend_label} backend {self.spec.name}: {type(exc).__name__}: {exc}",
            retry_in_job=False,
        ) from exc


class TransformersVLM(GrammarConstrainedGeneration):
    """A local VLM; see docs/adding-a-model.md."""

    def __init__(self, spec: ModelSpec):
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.spec = spec
        self.device = resolve_device(spec.get("device", "auto"))
        self.batch_size = int(spec.get("batch_size", 1) or 1)
        self.image_max_side = spec.get("image_max_side")
        trust = bool(spec.get("trust_remote_code", False))
        location = resolve_model_location(spec.model)
        self.processor = AutoProcessor.from_pretrained(
            location, revision=spec.revision, trust_remote_code=trust
        )
        self.model = AutoModelForImageTextToText.from_pretrained(
            location,
            revision=spec.revision,
            dtype=_resolve_dtype(spec.get("dtype", "auto")),
            trust_remote_code=trust,
            device_map=self.device,  # weights go straight to the device
        )
        self.model.eval()
        self.tokenizer = getattr(self.processor, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError(f"{spec.model}: the processor has no tokenizer")
        self.tokenizer.padding_side = "left"
        self._setup_decoding()

    # ---------------------------------------------------------------- prompts
    def _messages(self, request: VLMRequest) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append(
                {"role": "system", "content": [{"type": "text", "text": request.system}]}
            )
        content: list[dict[str, Any]] = []
        if request.image_path:
            content.append({"type": "image"})
        content.append({"type": "text", "text": request.text})
        messages.append({"role": "user", "content": content})
        return messages

    def prompt_text(self, request: VLMRequest) -> str:
        """The chat-templated prompt (image placeholders unexpanded)."""
        return self.processor.apply_chat_template(
            self._messages(request), tokenize=False, add_generation_prompt=True
        )

    def _encode(self, requests: list[VLMRequest]):
        texts = [self.prompt_text(r) for r in requests]
        images = [load_image(r.image_path, self.image_max_side) for r in requests if r.image_path]
        inputs = self.processor(
            text=texts, images=images or None, padding=True, return_tensors="pt"
        )
        return inputs.to(self.model.device, self.model.dtype)
