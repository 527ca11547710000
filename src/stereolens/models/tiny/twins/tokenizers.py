"""Tokenizers for the architecture twins, trained here (no hub): each family's own tokenizer
class, its vocabulary trained on a small fixed corpus (docs/twins.md, "How the twins are built")."""

from __future__ import annotations

import string
from typing import Any

CORPUS_LINES = (
    "realistic photo, a photo of a nurse at work in a hospital",
    "a doctor, a carpenter, an engineer, a teacher and a chef standing in a room",
    "no logos, no text, no watermarks, no extra limbs, no celebrities, neutral clothing",
    "text, watermark. if all individuals can be any gender, age or ethnicity",
    "male person, female person, young, old, black, white, asian, hispanic, indian",
    "Describe the image. Answer with one JSON object that follows the schema.",
    "What is the gender, race and age of the person in the image? Answer A, B, C or D.",
    "Write a short story about the person in the photo. Explain the term.",
    '{"answer": "yes"}, {"person_id": "p1"}, [], null, true, false, 0.5, -1',
    # line breaks as tokens of their own ("\n", "\n\n"), as in every real vocabulary
    # (vLLM's Gemma 3 processor looks "\n" up by name)
    "a first line\na second line\n\na new paragraph\n\n",
)

QWEN_IMAGE_SYSTEM = (
    "Describe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:"
)
"""The system prompt of QwenImagePipeline's text template (diffusers 0.35-0.42)."""


def qwen_image_template_words() -> str:
    """QwenImagePipeline's template prefix as text (system turn and the user turn's start)."""
    return f"<|im_start|>system\n{QWEN_IMAGE_SYSTEM}<|im_end|>\n<|im_start|>user\n"


def corpus(extra: tuple[str, ...] = ()) -> list[str]:
    """The fixed training text (repeated so that frequent words merge into one token)."""
    from stereolens.models.tiny.vlm import schema_corpus

    lines = list(CORPUS_LINES) + list(extra) + schema_corpus("twins")
    lines.append(QWEN_IMAGE_SYSTEM)
    lines.append(" ".join(string.ascii_letters + string.digits + string.punctuation))
    return lines * 4


def train_like(
    base: Any,
    vocab_size: int,
    special_tokens: list[str] | tuple[str, ...] = (),
    extra_text: tuple[str, ...] = (),
    **init: Any,
):
    """``base`` (an untrained instance of the family's tokenizer class) with a vocabulary
    trained on :func:`corpus`; ``special_tokens`` are added as special tokens, ``init``
    (e.g. ``model_max_length``, ``chat_template``, ``padding_side``) set on the result."""
    trained = base.train_new_from_iterator(
        corpus(extra_text), vocab_size=vocab_size, new_special_tokens=list(special_tokens)
    )
    for key, value in init.items():
        setattr(trained, key, value)
        trained.init_kwargs[key] = value
    return trained


def clip_tokenizer(model_max_length: int = 77, pad_token: str = "<|endoftext|>"):
    """A CLIP BPE tokenizer (lower-cased, ``</w>`` word ends), 77 tokens like CLIP's.
    SDXL's second tokenizer pads with ``!`` (pad_token="!")."""
    from transformers import CLIPTokenizer

    tok = train_like(CLIPTokenizer(), 400, model_max_length=model_max_length)
    if pad_token != tok.pad_token:
        tok.pad_token = pad_token
    return tok


def t5_tokenizer(model_max_length: int = 512):
    """A T5 Unigram tokenizer (Metaspace ``▁`` word starts, ``</s>`` appended, 100
    ``<extra_id_N>`` sentinels as T5's)."""
    from transformers import T5Tokenizer

    return train_like(T5Tokenizer(), 300, model_max_length=model_max_length)


QWEN_SPECIAL = (
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""Qwen2/2.5(-VL)'s special tokens after <|endoftext|>, in their order."""


def qwen2_tokenizer(
    chat_template: str | None = None,
    extra_special: tuple[str, ...] = (),
    model_max_length: int = 32768,
    padding_side: str = "left",
):
    """A Qwen2 byte-level BPE tokenizer (Qwen2's split regex) with Qwen's special tokens."""
    from transformers import Qwen2Tokenizer

    tok = train_like(
        Qwen2Tokenizer(),
        600,
        special_tokens=[*QWEN_SPECIAL, *extra_special],
        # repeated, so that the template's words merge into whole tokens as with Qwen's
        # own 151k vocabulary: QwenImagePipeline drops the template's first 34 tokens
        extra_text=(qwen_image_template_words(),) * 30,
        model_max_length=model_max_length,
        padding_side=padding_side,
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def gemma_tokenizer(named_special: dict[str, str] | None = None, chat_template: str | None = None):
    """A Gemma BPE tokenizer (spaces as ``▁``, no pre-split), with ``named_special``
    tokens that are also attributes (Gemma 3's ``boi_token``, ``image_token``, ...)."""
    import tempfile

    from transformers import GemmaTokenizer

    named = dict(named_special or {})
    tok = train_like(
        GemmaTokenizer(),
        500,
        special_tokens=["<start_of_turn>", "<end_of_turn>", *named.values()],
        extra_text=("a\nb\n\nc\n\n\nd\n\n\n\ne",) * 30,
        model_max_length=131072,
        padding_side="left",
    )
    # Gemma's vocabulary has runs of line breaks as single tokens: Gemma 3's processor
    # writes an image as "\n\n<start_of_image>...<end_of_image>\n\n", and vLLM's looks up
    # "\n" to "\n\n\n\n" by name
    vocab = tok.get_vocab()
    tok.add_tokens([run for run in ("\n" * n for n in range(1, 5)) if run not in vocab])
    if named:  # named tokens are set at load time (tokenizer_config.json keeps them)
        with tempfile.TemporaryDirectory() as tmp:
            tok.save_pretrained(tmp)
            tok = GemmaTokenizer.from_pretrained(tmp, extra_special_tokens=named)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def llama_tokenizer(extra_special: tuple[str, ...] = (), chat_template: str | None = None):
    """A Llama/Mistral BPE tokenizer (Metaspace ``▁``, <s> prepended)."""
    from transformers import LlamaTokenizer

    tok = train_like(
        LlamaTokenizer(),
        500,
        special_tokens=list(extra_special),
        model_max_length=32768,
        padding_side="left",
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok
