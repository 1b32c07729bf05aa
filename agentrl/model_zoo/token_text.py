"""Token ids as display text, for the token view of ``agentrl view``.

    texts = TokenTexts()                        # one per viewer process
    texts("smollm2-135m-instruct", [1, 9690])   # ['<|im_start|>', 'system'], or None
    texts("smollm2-135m-instruct", [])          # only loads it (the viewer does so when it starts)

A model's tokenizer is read from its ``tokenizer.json`` with the ``tokenizers`` library (the
Rust tokenizer that transformers' fast tokenizers wrap): importing it and loading SmolLM2's
file takes about 0.15 s, where ``transformers.AutoTokenizer`` costs 5-9 s on a 2-core machine,
almost all of it importing transformers (its auto classes import every model configuration).
Each id is decoded on its own with special tokens kept, and then, where the model's
``tokenizer_config.json`` sets ``clean_up_tokenization_spaces`` (and the model is not BPE,
for which transformers skips it unless forced), with transformers' clean-up of spaces before
punctuation and contractions (``clean_up_tokenization``), as transformers'
``tokenizer.decode([id])`` does (transformers 5.x). Checked equal to it for all 49,152 ids
of SmolLM2-135M-Instruct's vocabulary (a BPE tokenizer without the clean-up), and in tests
on a WordLevel tokenizer with the clean-up on and on SmolLM2's with it asked for.
A model without a ``tokenizer.json`` (a slow, SentencePiece-only tokenizer) falls back to
``AutoTokenizer``; a hub id is looked up in the local Hugging Face cache only (nothing is
downloaded).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from agentrl.model_zoo import resolve_model_path

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

Decoder = Callable[[Sequence[int]], "list[str]"]
"""``decode(ids) -> one string per id``."""


class TokenTexts:
    """``(model_path, ids) -> list[str] | None``: one display string per token id, decoded
    with the tokenizer of ``model_path`` (a known model name, a local Hugging Face folder or
    a hub id already in the local cache); ``None`` when that tokenizer cannot be loaded (the
    viewer then shows the ids). Each model's tokenizer is loaded once and kept; calls from
    several threads are safe, and a call waits for a load of the same model in progress."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decoders: dict[str, Decoder | None] = {}
        self._loading: dict[str, threading.Lock] = {}

    def __call__(self, model_path: str, ids: Sequence[int]) -> list[str] | None:
        decode = self.decoder(model_path)
        return None if decode is None else decode([int(i) for i in ids])

    def decoder(self, model_path: str) -> Decoder | None:
        """The decoder of ``model_path``, loaded on first use (None: cannot be loaded)."""
        with self._lock:
            if model_path in self._decoders:
                return self._decoders[model_path]
            per_model = self._loading.setdefault(model_path, threading.Lock())
        with per_model:  # one load per model; other models are not held up
            with self._lock:
                if model_path in self._decoders:
                    return self._decoders[model_path]
            decode = _load(model_path)
            with self._lock:
                self._decoders[model_path] = decode
        return decode


def _load(model_path: str) -> Decoder | None:
    """The decoder of ``model_path``, or None (logged as a warning) when its tokenizer cannot
    be loaded: a missing or moved model only costs the token text."""
    try:
        folder = resolve_model_path(model_path)
        file = _tokenizer_file(folder)
        if file is not None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(file))
            if _cleans_up(file.with_name(TOKENIZER_CONFIG_FILE), type(tok.model).__name__):
                return lambda ids: [clean_up_tokenization(t)
                                    for t in tok.decode_batch([[i] for i in ids], skip_special_tokens=False)]
            return lambda ids: tok.decode_batch([[i] for i in ids], skip_special_tokens=False)
        from transformers import AutoTokenizer  # no tokenizer.json: the slow path (seconds)

        slow: Any = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        return lambda ids: [slow.decode([i]) for i in ids]
    except Exception as exc:  # noqa: BLE001 - any failure only costs the token text
        log.warning("token view shows ids: tokenizer of %s: %s", model_path, exc)
        return None


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization``: the spaces a word-level detokenizer leaves
    before punctuation and English contractions removed (``"it 's ."`` -> ``"it's."``)."""
    for spaced, joined in _CLEAN_UP:
        text = text.replace(spaced, joined)
    return text


_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _cleans_up(config_file: Path, model_type: str) -> bool:
    """Whether transformers' ``decode`` applies ``clean_up_tokenization`` for the tokenizer
    configured in ``config_file`` (``tokenizer_config.json``; missing: no): its
    ``clean_up_tokenization_spaces``, skipped for a ``BPE`` model unless
    ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output`` is set too."""
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict) or not config.get("clean_up_tokenization_spaces"):
        return False
    return model_type != "BPE" or bool(
        config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))


def _tokenizer_file(folder: str) -> Path | None:
    """``tokenizer.json`` of a local folder, or of a hub id in the local Hugging Face cache."""
    path = Path(folder)
    if path.is_dir():
        file = path / TOKENIZER_FILE
        return file if file.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(folder, TOKENIZER_FILE)
    return Path(found) if isinstance(found, str) else None
