"""The ``tiny-random-smollm2`` recipe: a 2-layer random Llama (hidden 64, float32, 13 MB)
with SmolLM2's tokenizer, chat template and stop ids, for fast tests.

It prepares ``smollm2-135m-instruct`` in the same cache first and copies its tokenizer
files byte for byte; its recipe hash includes the parent's, so a new SmolLM2 folder
rebuilds it. torch and transformers are imported inside :func:`_build_tiny`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.model_zoo.cache import _RECIPE_VERSION, _hash
from agentrl.model_zoo.smollm2 import _SMOLLM2_NAME, _smollm2_recipe

_TINY_NAME = "tiny-random-smollm2"

# Tokenizer files copied byte for byte from the prepared SmolLM2 folder into the tiny model.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

_TINY_ARCH: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,  # vLLM's CPU attention needs head_dim >= 32 (platform notes)
    "seed": 1234,
}


def _tiny_recipe() -> dict[str, Any]:
    return {
        "recipe_version": _RECIPE_VERSION,
        "parent": _SMOLLM2_NAME,
        "parent_recipe_hash": _hash(_smollm2_recipe()),
        "architecture": dict(_TINY_ARCH),
        "dtype": "float32",
    }


def _build_tiny(out: Path, cache_dir: Path, prepare_model: Callable[[str, Path], Path]) -> None:
    """Build the tiny model in ``out`` from SmolLM2's tokenizer and config (``prepare_model``:
    the model zoo's own, which prepares the SmolLM2 folder in ``cache_dir`` first)."""
    import torch  # heavy: torch
    from transformers import AutoConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM  # heavy: transformers

    parent = prepare_model(_SMOLLM2_NAME, cache_dir)
    for filename in _TOKENIZER_FILES:
        shutil.copy2(parent / filename, out / filename)
    parent_config = AutoConfig.from_pretrained(str(parent))
    arch = dict(_TINY_ARCH)
    seed = arch.pop("seed")
    config = LlamaConfig(
        vocab_size=parent_config.vocab_size,
        hidden_act="silu",
        max_position_embeddings=parent_config.max_position_embeddings,
        rms_norm_eps=parent_config.rms_norm_eps,
        rope_parameters=dict(parent_config.rope_parameters),
        tie_word_embeddings=True,
        bos_token_id=parent_config.bos_token_id,
        eos_token_id=parent_config.eos_token_id,
        pad_token_id=parent_config.pad_token_id,
        architectures=["LlamaForCausalLM"],
        dtype="float32",
        **arch,
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    finally:
        torch.random.set_rng_state(generator_state)
    # The parent's generation config (both stop ids, no sampling defaults), not one
    # derived from config.json.
    model.generation_config = GenerationConfig.from_pretrained(str(parent))
    model.save_pretrained(str(out))
