"""PolicyTrainer with real parts: a tiny random Llama, FSDP2 on a gloo group of one."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from agentrl.errors import CheckpointError, ConfigError, ContractError
from agentrl.trainer import PolicyTrainer, TrainerConfig, init_single_process_group
from tests.helpers.trainer import make_batch, make_tiny_llama, run_trainer_cases
from agentrl.types import SamplingRecord, TokenBatch, TokenSequence

pytestmark = pytest.mark.usefixtures("process_group")


def _trainer(path: str, **kw) -> PolicyTrainer:
    return PolicyTrainer(TrainerConfig(model_path=path, **{"lr": 1e-3, **kw}))


def _reference_log_probs(model_path: str, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """Plain HF forward per row, log_softmax(logits / T), no trainer code involved."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.eval()
    out = []
    with torch.no_grad():
        for s in batch.row_slices():
            ids = batch.input_ids[s]
            logits = model(input_ids=ids[None]).logits[0]  # (L, V)
            logp = torch.log_softmax(logits / temperature, dim=-1)  # (L, V)
            row = torch.zeros(len(ids))
            row[1:] = logp[:-1].gather(-1, ids[1:, None]).squeeze(-1)
            out.append(row)
    return torch.cat(out)


def _with_behavior(batch: TokenBatch, per_token: torch.Tensor) -> TokenBatch:
    """Rebuild ``batch`` through ``TokenBatch.pack`` with engine log-probs taken from
    ``per_token`` ([T]) on the loss tokens."""
    rows = []
    for i, s in enumerate(batch.row_slices()):
        mask = batch.loss_mask[s]
        rows.append(
            TokenSequence(
                input_ids=batch.input_ids[s].tolist(),
                loss_mask=mask.long().tolist(),
                behavior_log_probs=per_token[s][mask > 0].tolist(),
                advantages=batch.advantages[s].tolist(),
                group_id=batch.group_ids[i],
                policy_version=int(batch.policy_versions[i]),
                episode_id=batch.episode_ids[i],
            )
        )
    return TokenBatch.pack(rows, batch.sampling)


# ---------------------------------------------------------------- log-probs


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.5])
def test_C04_recomputed_log_probs_equal_reference_at_temperature(tiny_llama_path: str, temperature: float) -> None:
    batch = make_batch(num_rows=5, seed=3, temperature=temperature)
    trainer = _trainer(tiny_llama_path, micro_batch_size=3)  # padded micro-batches
    got = trainer.compute_log_probs(batch)
    assert got.shape == (batch.num_tokens,) and got.dtype == torch.float32
    ref = _reference_log_probs(tiny_llama_path, batch, temperature)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    starts = [s.start for s in batch.row_slices()]
    assert torch.equal(got[starts], torch.zeros(len(starts)))
    # and the temperature really matters
    other = _reference_log_probs(tiny_llama_path, batch, temperature * 1.3)
    assert (got - other).abs().max() > 1e-2


def test_behavior_gap_is_zero_at_equal_weights_and_measures_an_offset(tiny_llama_path: str) -> None:
    base = make_batch(num_rows=4, seed=5, temperature=0.8)
    lp = _trainer(tiny_llama_path).compute_log_probs(base)

    m = _trainer(tiny_llama_path).step(_with_behavior(base, lp)).metrics
    assert m["rollout_corr/gap_abs_mean"] < 1e-6
    assert m["rollout_corr/gap_abs_max"] < 1e-5

    m = _trainer(tiny_llama_path).step(_with_behavior(base, lp - 0.25)).metrics
    assert m["rollout_corr/gap_abs_mean"] == pytest.approx(0.25, abs=1e-5)
    assert m["rollout_corr/gap_abs_max"] == pytest.approx(0.25, abs=1e-5)


def test_C03_garbage_behavior_log_probs_at_observation_positions_change_nothing(tiny_llama_path: str) -> None:
    clean = make_batch(num_rows=4, seed=6)
    off = clean.loss_mask == 0
    for garbage in (float("nan"), 1e9):
        dirty = dataclasses.replace(
            clean, behavior_log_probs=torch.where(off, torch.full_like(clean.behavior_log_probs, garbage), clean.behavior_log_probs)
        )
        m_clean = _trainer(tiny_llama_path, ppo_epochs=2).step(clean).metrics
        m_dirty = _trainer(tiny_llama_path, ppo_epochs=2).step(dirty).metrics
        for k in m_clean:
            if not k.startswith("perf/"):
                assert m_dirty[k] == m_clean[k], (garbage, k)


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("sampling", [SamplingRecord(top_p=0.9), SamplingRecord(top_k=50)])
def test_truncated_sampling_is_refused(tiny_llama_path: str, sampling: SamplingRecord) -> None:
    batch = dataclasses.replace(make_batch(num_rows=2), sampling=sampling)
    trainer = _trainer(tiny_llama_path)
    with pytest.raises(ConfigError, match="top_p=.*top_k="):
        trainer.step(batch)
    with pytest.raises(ConfigError, match="top_p=.*top_k="):
        trainer.compute_log_probs(batch)


def test_top_k_disabled_values_are_accepted(tiny_llama_path: str) -> None:
    for top_k in (-1, 0):
        batch = dataclasses.replace(make_batch(num_rows=2), sampling=SamplingRecord(temperature=1.0, top_k=top_k))
        assert torch.isfinite(_trainer(tiny_llama_path).compute_log_probs(batch)).all()


def test_temperature_must_match_config_when_pinned(tiny_llama_path: str) -> None:
    trainer = _trainer(tiny_llama_path, temperature=1.0)
    with pytest.raises(ConfigError, match=r"batch.sampling.temperature=0.7 but TrainerConfig.temperature=1.0"):
        trainer.step(make_batch(num_rows=2, temperature=0.7))
    assert trainer.step(make_batch(num_rows=2, temperature=1.0)).metrics["actor/num_loss_tokens"] > 0


def test_bad_batches_are_refused_with_clear_errors(tiny_llama_path: str) -> None:
    trainer = _trainer(tiny_llama_path)
    # The one validating constructor already refuses a loss token with no prefix.
    with pytest.raises(ContractError, match=r"row 0 \(ep-x\): loss_mask is 1 on the first token"):
        TokenBatch.pack(
            [TokenSequence([1, 2, 3], [1, 1, 1], [-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], "g", 0, "ep-x")], SamplingRecord()
        )
    out_of_vocab = TokenBatch.pack([TokenSequence([1, 300, 3], [0, 1, 1], [-1.0, -1.0], [0.0, 1.0, 1.0], "g", 0)], SamplingRecord())
    with pytest.raises(ContractError, match=r"token id 300 outside the model's vocabulary \[0, 256\)"):
        trainer.compute_log_probs(out_of_vocab)
    no_loss = TokenBatch.pack([TokenSequence([1, 2, 3], [0, 0, 0], [], [0.0, 0.0, 0.0], "g", 0)], SamplingRecord())
    with pytest.raises(ContractError, match="no loss tokens"):
        trainer.step(no_loss)


def test_construction_errors(tiny_llama_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="model_path=.* is not a Hugging Face model folder"):
        PolicyTrainer(TrainerConfig(model_path=str(tmp_path)))
    with pytest.raises(ConfigError, match="micro_batch_size=0"):
        PolicyTrainer(TrainerConfig(model_path=tiny_llama_path, micro_batch_size=0))
    with pytest.raises(ConfigError, match="already exists"):
        init_single_process_group()
    # beside the real group used everywhere else: what a caller without one is told
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(ConfigError, match="init_process_group"):
        PolicyTrainer(TrainerConfig(model_path=tiny_llama_path))


# ---------------------------------------------------------------- training variants


def test_micro_batch_tokens_caps_padded_size_and_keeps_gradients(tiny_llama_path: str) -> None:
    trainer = _trainer(tiny_llama_path, row_layout="padded", micro_batch_size=4, micro_batch_tokens=20)
    rows = [TokenSequence(list(range(n)), [0] + [1] * (n - 1), [-1.0] * (n - 1), [0.0] + [1.0] * (n - 1), "g", 0) for n in (5, 9, 3, 12)]
    batch = TokenBatch.pack(rows, SamplingRecord())
    assert trainer._micro_batches([0, 1, 2, 3], batch) == [[0, 1], [2], [3]]  # rows in order, padded size <= 20
    packed = _trainer(tiny_llama_path, row_layout="packed", micro_batch_tokens=20)
    assert packed._micro_batches([0, 1, 2, 3], batch) == [[0, 2, 3], [1]]  # bin-packed: 12 + 5 + 3, then 9

    cases = {
        "capped": {"batch": {"num_rows": 5, "seed": 8}, "config": {"micro_batch_size": 4, "micro_batch_tokens": 24, "eps": 1e-6}},
        "uncapped": {"batch": {"num_rows": 5, "seed": 8}, "config": {"micro_batch_size": 4, "eps": 1e-6}},
    }
    res = run_trainer_cases(tiny_llama_path, cases)
    for name, g in res["uncapped"]["grads"].items():
        torch.testing.assert_close(res["capped"]["grads"][name], g, atol=1e-6, rtol=0, msg=name)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_llama_path: str) -> None:
    cases = {
        "plain": {"batch": {"num_rows": 4, "seed": 9}, "config": {"micro_batch_size": 2}},
        "checkpointed": {"batch": {"num_rows": 4, "seed": 9}, "config": {"micro_batch_size": 2, "gradient_checkpointing": True}},
    }
    res = run_trainer_cases(tiny_llama_path, cases)
    assert res["plain"]["metrics"]["actor/grad_norm"] > 1e-3
    for name, g in res["plain"]["grads"].items():
        torch.testing.assert_close(res["checkpointed"]["grads"][name], g, atol=1e-6, rtol=0, msg=name)


def test_bfloat16_compute_keeps_fp32_master_weights(tiny_llama_path: str) -> None:
    batch = make_batch(num_rows=4, seed=10)
    fp32 = _trainer(tiny_llama_path).compute_log_probs(batch)
    trainer = _trainer(tiny_llama_path, dtype="bfloat16")
    bf16 = trainer.compute_log_probs(batch)
    assert (bf16 - fp32).abs().max() < 0.1  # bf16 forward, fp32 log-softmax
    assert (bf16 - fp32).abs().max() > 0  # and it really ran in bf16
    before = trainer.full_state_dict()
    m = trainer.step(batch).metrics
    after = trainer.full_state_dict()
    assert all(np.isfinite(v) for v in m.values())
    assert all(t.dtype == torch.float32 for t in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_step_metrics_have_fixed_names_and_sane_values(tiny_llama_path: str) -> None:
    batch = make_batch(num_rows=4, seed=4)
    m = _trainer(tiny_llama_path, warmup_steps=4).step(batch).metrics
    assert set(m) == {
        "actor/pg_loss", "actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_dual", "actor/entropy",
        "actor/ratio_mean", "actor/kl_loss", "actor/grad_norm", "actor/lr", "actor/num_loss_tokens",
        "actor/num_loss_seqs", "actor/skipped_step", "actor/no_signal_steps", "actor/global_step",
        "rollout_corr/gap_abs_mean", "rollout_corr/gap_abs_max", "rollout_corr/gap_abs_p99",
        "rollout_corr/is_weight_mean", "rollout_corr/is_clipped_frac", "rollout_corr/token_masked_frac",
        "rollout_corr/seq_masked_frac", "rollout_corr/ess", "kl/coef",
        "perf/tokens_per_s", "perf/step_s", "perf/peak_memory_mb", "perf/padding_frac",
    }  # kl/ref_k* only with a reference model (test_policy_offpolicy.py)
    assert all(isinstance(v, float) for v in m.values())
    assert m["actor/num_loss_tokens"] == batch.num_loss_tokens
    assert m["actor/num_loss_seqs"] == 4
    # on-policy first epoch: ratio exactly 1, no clipping, KL 0, loss = -mean(advantage)
    assert m["actor/ratio_mean"] == 1.0 and m["actor/pg_clipfrac"] == 0.0 and m["actor/ppo_kl"] == 0.0
    adv = batch.advantages[batch.loss_mask > 0]
    assert m["actor/pg_loss"] == pytest.approx(-float(adv.mean()), abs=1e-6)
    assert m["actor/entropy"] == pytest.approx(np.log(256), abs=0.1)  # random init: near uniform
    assert m["actor/lr"] == pytest.approx(1e-3 / 4)  # first warmup step
    assert m["actor/global_step"] == 1.0 and m["actor/skipped_step"] == 0.0
    assert m["perf/step_s"] > 0 and m["perf/tokens_per_s"] > 0
    # no KL term, no correction: the KL loss is 0 and every weight is 1
    assert m["actor/kl_loss"] == 0.0 and m["kl/coef"] == 0.0 and m["actor/pg_clipfrac_dual"] == 0.0
    assert m["rollout_corr/is_weight_mean"] == 1.0 and m["rollout_corr/ess"] == 1.0
    assert m["rollout_corr/is_clipped_frac"] == m["rollout_corr/token_masked_frac"] == m["rollout_corr/seq_masked_frac"] == 0.0
    # the behavior log-probs of make_batch are not the model's: the gap is large and ordered
    assert 0 < m["rollout_corr/gap_abs_mean"] <= m["rollout_corr/gap_abs_p99"] <= m["rollout_corr/gap_abs_max"]


def test_a_batch_with_every_advantage_zero_moves_no_weight(tiny_llama_path: str) -> None:
    """After a real step AdamW holds momentum; a zero-gradient AdamW step would still move
    every weight along the last update (and decay it). A batch with no signal (all
    advantages 0, no KL term) leaves the weights as they were, and the optimizer state too:
    the next real step lands exactly where it lands without the no-signal batch."""
    def weights(t: PolicyTrainer) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in t.model.state_dict().items()}

    first, second = make_batch(num_rows=4, seed=4), make_batch(num_rows=4, seed=6)
    flat = make_batch(num_rows=4, seed=5)
    flat = dataclasses.replace(flat, advantages=torch.zeros_like(flat.advantages))

    trainer = _trainer(tiny_llama_path, weight_decay=0.01, ppo_epochs=2)
    m = trainer.step(first).metrics
    assert m["actor/no_signal_steps"] == 0.0 and m["actor/grad_norm"] > 0
    after_first = weights(trainer)
    m = trainer.step(flat).metrics
    assert m["actor/grad_norm"] == 0.0 and m["actor/no_signal_steps"] == 2.0 and m["actor/skipped_step"] == 0.0
    assert m["actor/global_step"] == 2.0
    assert all(torch.equal(v, after_first[k]) for k, v in weights(trainer).items())
    trainer.step(second)

    plain = _trainer(tiny_llama_path, weight_decay=0.01, ppo_epochs=2)
    plain.step(first)
    plain.step(second)
    assert all(torch.equal(v, weights(trainer)[k]) for k, v in weights(plain).items())

    # what the skip prevents: AdamW with momentum moves a weight on a zero gradient
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([w], lr=1e-3, weight_decay=0.01)
    w.grad = torch.tensor([1.0, -2.0, 0.5])
    opt.step()
    moved_once = w.detach().clone()
    w.grad = torch.zeros(3)
    opt.step()
    assert not torch.equal(w.detach(), moved_once)


def test_step_token_values_are_epoch_zeros_log_probs_and_entropies(tiny_llama_path: str) -> None:
    """What the replay store keeps per sampled token (``StepResult.log_probs`` / ``entropies``): the log-prob at
    the weights the update started from (a plain HF forward agrees) and the entropy whose
    token mean is ``actor/entropy``; 0 off the loss tokens; the metrics are those of a step
    on a fresh trainer (the capture changes nothing)."""
    batch = make_batch(num_rows=4, seed=5)
    trainer = _trainer(tiny_llama_path)
    ref = _reference_log_probs(tiny_llama_path, batch, batch.sampling.temperature)  # (T,) at the start weights
    result = trainer.step(batch)
    m, lp, ent = result.metrics, result.log_probs, result.entropies
    mask = batch.loss_mask > 0
    assert lp.shape == ent.shape == (batch.num_tokens,) and lp.dtype == ent.dtype == torch.float32
    assert lp.device.type == ent.device.type == "cpu"
    assert torch.allclose(lp[mask], ref[mask], atol=1e-5)
    assert bool((lp[~mask] == 0).all()) and bool((ent[~mask] == 0).all())
    assert bool((ent[mask] > 0).all()) and float(ent[mask].max()) <= np.log(256) + 1e-4
    assert float(ent[mask].double().mean()) == pytest.approx(m["actor/entropy"], abs=1e-6)
    again = _trainer(tiny_llama_path).step(batch).metrics
    assert {k: v for k, v in again.items() if not k.startswith("perf/")} == \
        {k: v for k, v in m.items() if not k.startswith("perf/")}


# ---------------------------------------------------------------- state


def test_full_state_dict_has_hf_names_and_casts(tiny_llama_path: str) -> None:
    plain = AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).state_dict()
    trainer = _trainer(tiny_llama_path)
    sd = trainer.full_state_dict()
    assert sd.keys() == plain.keys()
    for k in sd:
        assert sd[k].device.type == "cpu"
        assert torch.equal(sd[k], plain[k]), k
    bf = trainer.full_state_dict(torch.bfloat16)
    assert all(v.dtype == torch.bfloat16 for v in bf.values())
    # a snapshot: the next update does not reach into a dict already handed out
    trainer.step(make_batch(num_rows=2))
    for k in sd:
        assert torch.equal(sd[k], plain[k]), k
    assert any(not torch.equal(v, sd[k]) for k, v in trainer.full_state_dict().items())


@pytest.mark.parametrize("tied", [False, True])
def test_save_hf_round_trip(tmp_path: Path, tied: bool) -> None:
    src = make_tiny_llama(tmp_path / "src", seed=1, tie_word_embeddings=tied)
    (Path(src) / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    trainer = _trainer(src)
    trainer.step(make_batch(num_rows=3, seed=2))
    trainer.save_hf(tmp_path / "out")
    assert (tmp_path / "out" / "config.json").exists()
    assert list((tmp_path / "out").glob("*.safetensors"))
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text()) == {"model_max_length": 512}
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    assert loaded.config.tie_word_embeddings == tied
    want = trainer.full_state_dict()
    got = loaded.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    if tied:
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


def test_checkpoint_round_trip_resumes_bit_identically(tiny_llama_path: str, tmp_path: Path) -> None:
    cfg = {"ppo_epochs": 2, "warmup_steps": 3, "micro_batch_size": 2, "clip_ratio_high": 0.28}
    b1, b2 = make_batch(num_rows=4, seed=30), make_batch(num_rows=5, seed=31, temperature=0.7)
    a = _trainer(tiny_llama_path, **cfg)
    a.step(b1)
    a.step(b2)
    a.save_checkpoint(tmp_path / "ck")
    rng_after_save = (torch.rand(4), np.random.rand(2), random.random())
    cont = [a.step(b1).metrics, a.step(b2).metrics]
    w_cont = a.full_state_dict()

    torch.manual_seed(123), np.random.seed(123), random.seed(123)  # disturb the RNGs
    b = _trainer(tiny_llama_path, **cfg)
    b.load_checkpoint(tmp_path / "ck")
    assert b.global_step == 2
    assert torch.equal(torch.rand(4), rng_after_save[0])
    assert np.array_equal(np.random.rand(2), rng_after_save[1])
    assert random.random() == rng_after_save[2]
    resumed = [b.step(b1).metrics, b.step(b2).metrics]
    for mc, mr in zip(cont, resumed):
        for k in mc:
            if not k.startswith("perf/"):
                assert mr[k] == mc[k], k  # bit-identical
    assert cont[0]["actor/pg_clipfrac"] > 0 or cont[1]["actor/pg_clipfrac"] > 0  # the update is not trivial
    w_res = b.full_state_dict()
    for k in w_cont:
        assert torch.equal(w_res[k], w_cont[k]), k

    # a fresh trainer without the checkpoint does differ (the test can fail)
    fresh = _trainer(tiny_llama_path, **cfg).step(b1).metrics
    assert fresh["actor/pg_loss"] != cont[0]["actor/pg_loss"]


def test_checkpoint_errors(tiny_llama_path: str, tmp_path: Path) -> None:
    trainer = _trainer(tiny_llama_path)
    with pytest.raises(CheckpointError, match="not a complete trainer checkpoint"):
        trainer.load_checkpoint(tmp_path / "nothing")
    trainer.save_checkpoint(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        trainer.save_checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / "COMPLETE").unlink()  # as if the writer crashed before the end
    with pytest.raises(CheckpointError, match="not a complete trainer checkpoint"):
        trainer.load_checkpoint(tmp_path / "ck")
