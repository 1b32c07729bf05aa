"""PolicyTrainer with off-policy inputs and a reference model: real parts (a tiny random
Llama, FSDP2 on a gloo group of one)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers
from torch.distributed.checkpoint import FileSystemReader

from agentrl.errors import ConfigError
from agentrl.trainer import PolicyTrainer, TrainerConfig
from agentrl.trainer.config import KLConfig, RolloutCorrectionConfig
from agentrl.trainer.losses import kl_penalty
from agentrl.types import TokenBatch, TokenSequence
from tests.helpers.trainer import full_grads, make_batch, make_tiny_llama

pytestmark = pytest.mark.usefixtures("process_group")


def _trainer(path: str, **kw) -> PolicyTrainer:
    return PolicyTrainer(TrainerConfig(model_path=path, **{"lr": 1e-3, **kw}))


@pytest.fixture(scope="module")
def reference_path(tmp_path_factory) -> str:
    """Another tiny random Llama (seed 1): a reference that differs from the policy."""
    return make_tiny_llama(tmp_path_factory.mktemp("reference"), seed=1)


def _repack(batch: TokenBatch, behavior: torch.Tensor, proximal: torch.Tensor | None = None,
            advantages: torch.Tensor | None = None) -> TokenBatch:
    """``batch`` through ``TokenBatch.pack`` with engine log-probs from ``behavior`` ([T]) on
    its loss tokens (and optionally proximal log-probs / advantages, [T])."""
    adv = batch.advantages if advantages is None else advantages
    rows = []
    for i, s in enumerate(batch.row_slices()):
        mask = batch.loss_mask[s]
        rows.append(TokenSequence(batch.input_ids[s].tolist(), mask.long().tolist(), behavior[s][mask > 0].tolist(),
                                  adv[s].tolist(), batch.group_ids[i], int(batch.policy_versions[i]), batch.episode_ids[i]))
    return TokenBatch.pack(rows, batch.sampling, proximal_log_probs=proximal)


def _plain_log_probs(model: torch.nn.Module, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """Plain HF forward per row, log_softmax(logits / T) at each token (0 at row starts);
    differentiable when grad is on. No trainer code involved."""
    out = []
    for s in batch.row_slices():
        ids = batch.input_ids[s]
        logp = torch.log_softmax(model(input_ids=ids[None]).logits[0] / temperature, dim=-1)  # (L, V)
        out.append(torch.cat([torch.zeros(1), logp[:-1].gather(-1, ids[1:, None]).squeeze(-1)]))  # (L,)
    return torch.cat(out)  # (T,)


# ---------------------------------------------------------------- decoupled PPO reduces to PPO


def test_on_policy_proximal_and_correction_give_todays_step(tiny_llama_path: str) -> None:
    """With proximal == behavior (on-policy data) every weight is 1 and nothing is masked,
    so giving the proximal log-probs and switching every correction on changes nothing."""
    base = make_batch(num_rows=5, seed=40, temperature=0.9)
    lp = _trainer(tiny_llama_path).compute_log_probs(base)
    on_policy = _repack(base, lp)
    plain = _trainer(tiny_llama_path, max_grad_norm=None)
    m_plain = plain.step(on_policy).metrics
    corrected = _trainer(
        tiny_llama_path, max_grad_norm=None,
        rollout_correction=RolloutCorrectionConfig(is_level="token", is_cap=1.5, token_mask_band=(0.9, 1.1),
                                                   seq_mask_band=(0.95, 1.05)),
    )
    m_corr = corrected.step(_repack(base, lp, proximal=lp)).metrics
    g_plain, g_corr = full_grads(plain), full_grads(corrected)
    assert m_plain["actor/grad_norm"] > 1e-3
    for name, g in g_plain.items():
        torch.testing.assert_close(g_corr[name], g, atol=1e-6, rtol=0, msg=name)
    assert m_corr["rollout_corr/is_weight_mean"] == 1.0 and m_corr["rollout_corr/ess"] == 1.0
    assert m_corr["rollout_corr/token_masked_frac"] == m_corr["rollout_corr/seq_masked_frac"] == 0.0
    assert m_corr["rollout_corr/gap_abs_max"] == 0.0 and m_plain["rollout_corr/gap_abs_max"] < 1e-5
    assert m_corr["actor/pg_loss"] == pytest.approx(m_plain["actor/pg_loss"], abs=1e-6)


def test_a_given_proximal_is_the_ratio_denominator(tiny_llama_path: str) -> None:
    """Proximal log-probs 0.1 below the model's: the first epoch's ratio is exp(0.1) on
    every loss token (not 1, as with proximal taken from the forward)."""
    base = make_batch(num_rows=4, seed=41)
    lp = _trainer(tiny_llama_path).compute_log_probs(base)
    m = _trainer(tiny_llama_path).step(_repack(base, lp, proximal=lp - 0.1)).metrics
    assert m["actor/ratio_mean"] == pytest.approx(math.exp(0.1), abs=1e-5)
    assert m["actor/ppo_kl"] == pytest.approx(math.exp(0.1) - 1 - 0.1, abs=1e-6)
    assert m["rollout_corr/gap_abs_mean"] == pytest.approx(0.1, abs=1e-5)  # |proximal - behavior|


# ---------------------------------------------------------------- the reference model


def test_reference_is_the_initial_policy_frozen_and_not_checkpointed(tiny_llama_path: str, tmp_path: Path) -> None:
    assert _trainer(tiny_llama_path).reference is None  # coef 0: never loaded
    trainer = _trainer(tiny_llama_path, kl=KLConfig(coef=0.1, estimator="k3"))
    assert all(not p.requires_grad for p in trainer.reference.parameters()) and not trainer.reference.training
    batch = make_batch(num_rows=4, seed=42)
    first = trainer.step(batch).metrics
    # the reference is the initial policy: at step 1 every estimator of KL(current || ref) is 0
    for k in ("kl/ref_k1", "kl/ref_k2", "kl/ref_k3", "actor/kl_loss"):
        assert abs(first[k]) < 1e-7, k
    assert first["kl/coef"] == 0.1
    second = trainer.step(batch).metrics
    assert second["kl/ref_k2"] > 1e-6 and second["kl/ref_k3"] > 1e-6
    assert second["actor/kl_loss"] == pytest.approx(0.1 * second["kl/ref_k3"], rel=1e-5)  # token-mean
    # frozen: its weights are still the folder's
    plain = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).state_dict()
    for name, p in trainer.reference.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        assert torch.equal(full.detach().cpu(), plain[name]), name
    # the checkpoint holds the policy and its optimizer only, as without a reference
    trainer.save_checkpoint(tmp_path / "with_ref")
    _trainer(tiny_llama_path).save_checkpoint(tmp_path / "without")
    keys = [set(FileSystemReader(str(tmp_path / d / "dcp")).read_metadata().state_dict_metadata) for d in ("with_ref", "without")]
    assert keys[0] == keys[1]


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_loss_gradient_matches_a_hand_built_loss(tiny_llama_path: str, reference_path: str, estimator: str) -> None:
    """The step's gradient (policy term + coef * token-mean of the KL term) equals the
    gradient of the same loss written by hand on a plain HF model and reference: the KL
    term's value is the estimate k, its gradient d * grad log p (that of KL(current ||
    reference); ratio and importance weight are 1 in this first pass), for every estimator."""
    temperature, coef = 0.8, 0.7
    batch = make_batch(num_rows=4, seed=43, temperature=temperature)
    trainer = _trainer(tiny_llama_path, max_grad_norm=None, micro_batch_tokens=30,
                       kl=KLConfig(coef=coef, estimator=estimator, reference_path=reference_path))
    m = trainer.step(batch).metrics
    got = full_grads(trainer)

    policy = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32)
    ref = transformers.AutoModelForCausalLM.from_pretrained(reference_path, dtype=torch.float32)
    mask = batch.loss_mask > 0  # (T,)
    n = float(mask.sum())
    with torch.no_grad():
        ref_lp = _plain_log_probs(ref, batch, temperature)[mask]  # (n,)
    lp = _plain_log_probs(policy, batch, temperature)[mask]  # (n,) with grad
    adv = batch.advantages[mask]  # (n,)
    ratio = torch.exp(lp - lp.detach())  # (n,) 1 at epoch 0: no clip binds
    d = (lp - ref_lp).detach()  # (n,)
    kl = kl_penalty(lp.detach(), ref_lp, estimator) + d * (lp - lp.detach())  # (n,) value k, gradient d
    kl_mean = float(kl.detach().mean())
    loss = (-adv * ratio).sum() / n + coef * kl.sum() / n
    loss.backward()
    assert m[f"kl/ref_{estimator}"] == pytest.approx(kl_mean, abs=1e-6)
    assert m["actor/kl_loss"] == pytest.approx(coef * kl_mean, abs=1e-6)
    assert m["kl/ref_k3"] > 1e-3  # the two models really differ
    for name, p in policy.named_parameters():
        torch.testing.assert_close(got[name], p.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_reference_with_another_vocabulary_is_refused(tiny_llama_path: str, tmp_path: Path) -> None:
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, head_dim=32)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "other")
    with pytest.raises(ConfigError, match=r"has 300 input-embedding rows but the policy .* has 256"):
        _trainer(tiny_llama_path, kl=KLConfig(coef=0.1, reference_path=str(tmp_path / "other")))


# ---------------------------------------------------------------- KL in the reward


def test_kl_to_reference_known_values(tiny_llama_path: str) -> None:
    """Behavior log-probs delta above the reference's (= the initial policy's) on every
    loss token: k1 = delta, k2 = delta^2 / 2, k3 = exp(-delta) - 1 + delta."""
    with pytest.raises(ConfigError, match="kl_to_reference needs a reference model"):
        _trainer(tiny_llama_path).kl_to_reference(make_batch(num_rows=2))
    trainer = _trainer(tiny_llama_path, kl=KLConfig(coef=0.05, estimator="k2", mode="reward"))
    base = make_batch(num_rows=5, seed=44, temperature=0.7)
    lp = trainer.compute_log_probs(base)
    delta = 0.3
    k, m = trainer.kl_to_reference(_repack(base, lp + delta))
    mask = base.loss_mask > 0
    assert k.shape == (base.num_tokens,) and k.dtype == torch.float32
    assert torch.equal(k[~mask], torch.zeros(int((~mask).sum())))
    torch.testing.assert_close(k[mask], torch.full((int(mask.sum()),), delta**2 / 2), atol=1e-5, rtol=0)
    assert m["kl/ref_k1"] == pytest.approx(delta, abs=1e-5)
    assert m["kl/ref_k2"] == pytest.approx(delta**2 / 2, abs=1e-5)
    assert m["kl/ref_k3"] == pytest.approx(math.exp(-delta) - 1 + delta, abs=1e-5)
    assert m["kl/coef"] == 0.05
    # reward mode adds nothing to the loss
    s = trainer.step(base).metrics
    assert s["actor/kl_loss"] == 0.0 and "kl/ref_k3" not in s


# ---------------------------------------------------------------- metric names


def _docs_metric_names() -> set[str]:
    """The policy-update names of docs/metrics.md's Metrics table (``actor/*``,
    ``rollout_corr/*``, ``kl/*``, ``perf/*``), with shorthand such as ``_max`` after
    ``rollout_corr/gap_abs_mean`` expanded to ``rollout_corr/gap_abs_max``."""
    import re

    text = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n#", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        prev = None
        for tok in re.findall(r"`([^`]+)`", first_cell):
            if tok.startswith("_") and prev is not None:
                tok = prev.rsplit("_", 1)[0] + tok  # `gap_abs_mean`, `_max` -> gap_abs_max
            names.add(tok)
            prev = tok
    return {n for n in names if n.split("/")[0] in ("actor", "rollout_corr", "kl", "perf")}


def test_docs_metric_table_names_exactly_what_step_returns(tiny_llama_path: str) -> None:
    """docs/metrics.md's table is the contract of metrics.jsonl: every name it lists is returned
    by a real step with every term on (a reference loaded, so kl/ref_* are present), and
    the step returns no policy name the table leaves out."""
    trainer = _trainer(tiny_llama_path, kl=KLConfig(coef=0.1), dual_clip_c=3.0,
                       rollout_correction=RolloutCorrectionConfig(is_level="token", token_mask_band=(0.5, 2.0)))
    got = set(trainer.step(make_batch(num_rows=4, seed=3)).metrics)
    table = _docs_metric_names()
    assert len(table) > 20  # the parse found the table
    assert table == got, (sorted(table - got), sorted(got - table))
