"""``agentrl export`` on a real run (Ray, vLLM, the FSDP2 trainer, tiny random SmolLM2,
HumanEval in bubblewrap, two iterations) exported by the real command, and the folder loaded
by plain transformers and by vLLM.

The random model earns reward 0, so GRPO's advantages are 0 and the trainer takes no step on
them (``actor/no_signal_steps``): the suite's shared ``trained_run`` ends with the starting
weights. This module's run uses GAE with a critic whose head starts non-zero
(``critic.head_init_std``), so its advantages are not 0 and every update moves the policy:
the exported weights differ from the model folder the run started from, so the tests can tell
that what is exported is the checkpoint, not the source. The export takes the policy only,
not the critic saved beside it.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def _agentrl(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200", TERM="dumb", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.fixture(scope="module")
def run_dir(ray_session, tmp_path_factory, tiny_model_path) -> Path:
    from agentrl.driver.controller import train
    from test_train_loop import make_cfg

    base = tmp_path_factory.mktemp("export-run")
    cfg = make_cfg(base, tiny_model_path, "run", "run.iterations=2", "trainer.lr=1e-3", "algorithm.advantage=gae",
                   "critic.lr=1e-3", "critic.head_init_std=0.05")
    summary = train(cfg)
    d = base / "run"
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert summary.iterations_done == 2 and all(m["actor/no_signal_steps"] == 0.0 for m in lines)
    assert (d / "checkpoints" / "latest").read_text() == "iter_2"
    assert (d / "checkpoints" / "iter_2" / "trainer_critic").is_dir()
    return d


@pytest.fixture(scope="module")
def exported(run_dir) -> tuple[Path, str]:
    out = run_dir.parent / "hf"
    r = _agentrl("export", str(run_dir), str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    return out, r.stdout


def _replay_batch(run_dir: Path):
    """Two of the run's own sampled rows of its first iteration (real loss masks, sampled from
    the starting weights) as one TokenBatch, and how many tokens were sampled in them."""
    from agentrl.replay import ReplayStore
    from agentrl.types import SamplingRecord, TokenBatch

    run_id = json.loads((run_dir / "checkpoints" / "iter_2" / "controller.json").read_text())["run_id"]
    with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}") as store:
        eps = [store.get_episode(s.episode_id) for s in store.list_episodes(run_id, 1, limit=2)]  # iteration 1
    assert len(eps) == 2
    rows = [r for ep in eps for r in ep.training_sequences([0.0] * len(ep.turns))]
    return TokenBatch.pack(rows, SamplingRecord(temperature=1.0)), sum(len(ep.behavior_log_probs()) for ep in eps)


def test_export_writes_a_plain_hf_folder_with_tied_weights_once(exported, tiny_model_path):
    from safetensors import safe_open

    out, stdout = exported
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "agentrl_export.json"} <= names
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".hf.")]  # no staging folder left
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        numel = sum(_prod(f.get_slice(k).get_shape()) for k in keys)
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
    assert all(k.startswith("model.") for k in keys)  # the policy only: the run's critic is not in it
    embed = 49152 * 64
    size = (out / "model.safetensors").stat().st_size
    assert numel * 4 <= size < numel * 4 + 64 * 1024  # fp32 tensors plus a small header
    assert size < (numel + embed) * 4  # the tied matrix (12.6 MB here, 108 MiB for SmolLM2) is not stored twice
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True and cfg["use_cache"] is True and cfg["dtype"] == "float32"
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    assert (out / "chat_template.jinja").read_text() == (Path(tiny_model_path) / "chat_template.jinja").read_text()
    marker = json.loads((out / "agentrl_export.json").read_text())
    assert marker["checkpoint"] == "iter_2" and marker["max_abs_diff"] <= 1e-6 and marker["tokens"] > 0
    for line in ("model.safetensors", "tied weights: lm_head.weight tied to model.embed_tokens.weight",
                 "round trip: max |trainer - exported| log-prob", "passed"):
        assert line in stdout, stdout


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def test_transformers_reloads_it_tied_and_scores_like_the_trainer(exported, run_dir, tiny_model_path, process_group):
    """The trainer loaded from the checkpoint and the exported folder in plain transformers
    give the same log-probs on the run's own sampled rows (1e-6, fp32). One row per
    micro-batch on the trainer's side: rows batched together round differently
    (``agentrl.commands.export._export_trainer_config``)."""
    import torch

    from agentrl.trainer import PolicyTrainer, TrainerConfig
    from agentrl.trainer.export import load_hf_folder, reference_log_probs

    out, _ = exported
    model = load_hf_folder(out)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied again
    source = load_hf_folder(tiny_model_path)
    moved = max(float((a - b).detach().abs().max()) for a, b in zip(model.parameters(), source.parameters()))
    assert moved > 1e-7  # the checkpoint's weights, not the starting folder's
    del source

    batch, sampled = _replay_batch(run_dir)
    trainer = PolicyTrainer(TrainerConfig(model_path=tiny_model_path, micro_batch_size=1, micro_batch_tokens=1))
    trainer.load_checkpoint(run_dir / "checkpoints" / "iter_2" / "trainer")
    want = trainer.compute_log_probs(batch)  # (T,)
    got = reference_log_probs(model, batch.input_ids, batch.seq_lens, batch.sampling.temperature)  # (T,)
    loss = batch.loss_mask > 0
    assert int(loss.sum()) == sampled > 0
    assert float((want - got).abs()[loss].max()) <= 1e-6
    # and the engine sampled these tokens from the same starting weights: the export is not
    # a different model (gap of the same order as the run's own rollout_corr gap)
    before = reference_log_probs(load_hf_folder(tiny_model_path), batch.input_ids, batch.seq_lens, 1.0)
    assert float((before - batch.behavior_log_probs).abs()[loss].max()) < 1e-4
    assert not torch.equal(before[loss], got[loss])
    del trainer
    gc.collect()


def test_vllm_loads_it_and_greedy_decoding_matches_transformers(exported, smollm2_tokenizer):
    """12 greedy tokens for two chat prompts, token for token. The random model's smallest
    top-1/top-2 logit gap on these paths is about 0.08 (measured), far above fp32 noise, so
    equal ids are expected, not lucky."""
    pytest.importorskip("vllm")
    import torch
    from vllm import LLM, SamplingParams

    from agentrl.trainer.export import load_hf_folder

    out, _ = exported
    prompts = [
        smollm2_tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False)
        for text in ("Guess a number between 1 and 10.", "What is 2 + 3?")
    ]
    hf = load_hf_folder(out)
    hf_ids = []
    with torch.no_grad():
        for p in prompts:
            seq = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=12, do_sample=False, min_new_tokens=12)
            hf_ids.append(seq[0, len(p):].tolist())
    del hf
    gc.collect()

    llm = LLM(model=str(out), dtype="float32", enforce_eager=True, max_model_len=1024, seed=0)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
        vllm_ids = [list(o.outputs[0].token_ids) for o in outs]
    finally:
        del llm
        gc.collect()
    assert vllm_ids == hf_ids


def test_bf16_export_needs_force_over_an_export_and_casts_exactly(exported, run_dir):
    import shutil

    import torch
    from safetensors.torch import load_file

    fp32, _ = exported
    out = run_dir.parent / "hf-bf16"
    shutil.copytree(fp32, out)  # an earlier export sits there
    refused = _agentrl("export", str(run_dir), str(out), "--dtype", "bfloat16")
    assert refused.returncode == 2 and "already exists; pass --force" in refused.stderr
    assert "Traceback" not in refused.stderr + refused.stdout
    assert load_file(out / "model.safetensors")["model.norm.weight"].dtype == torch.float32  # untouched

    r = _agentrl("export", str(run_dir), "--checkpoint", "iter_2", str(out), "--dtype", "bfloat16", "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bf16 weights equal the checked fp32 weights rounded to bf16" in r.stdout
    a, b = load_file(fp32 / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and "lm_head.weight" not in b
    assert all(b[k].dtype == torch.bfloat16 and torch.equal(b[k], a[k].to(torch.bfloat16)) for k in a)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((out / "agentrl_export.json").read_text())["dtype"] == "bfloat16"


def test_a_failed_round_trip_is_a_clear_error_and_writes_nothing(run_dir, process_group, monkeypatch):
    """A writer that corrupts one weight by 1e-3 (injected after the real save_hf) must be
    caught by the check: exit 1 with the measured difference, OUT_DIR never created."""
    from safetensors.torch import load_file, save_file
    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.trainer import PolicyTrainer

    real_save_hf = PolicyTrainer.save_hf

    def corrupting_save_hf(self, path, dtype=None, **kw):
        real_save_hf(self, path, dtype, **kw)
        f = Path(path) / "model.safetensors"
        sd = load_file(f)
        sd["model.norm.weight"] = sd["model.norm.weight"] + 1e-3
        save_file(sd, f, metadata={"format": "pt"})

    monkeypatch.setattr(PolicyTrainer, "save_hf", corrupting_save_hf)
    out = run_dir.parent / "hf-bad"
    r = CliRunner().invoke(app, ["export", str(run_dir), str(out)], env={"COLUMNS": "400"})
    assert r.exit_code == 1, r.output
    assert "export check failed: round-trip check failed" in r.output and "was not written" in r.output
    assert "Traceback" not in r.output
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".hf-bad.")]  # staging removed
