"""Pure tests of the decoupled PPO loss and its parts in agentrl.trainer.losses: dual clip,
KL estimators, rollout correction (token / sequence IS, token and sequence bands), the
assembled ``ppo_loss`` and the ``rollout_corr/*`` metrics. Known values are worked out by
hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer.config import RolloutCorrectionConfig
from agentrl.trainer.losses import (
    MAX_ABS_LOG_RATIO,
    PPO_TOKEN_SUM_METRICS,
    ROLLOUT_CORR_SUMS,
    kl_penalty,
    ppo_loss,
    quantile,
    rollout_corr_metrics,
    rollout_correction,
)

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]

CORRECTIONS = {
    "token IS": RolloutCorrectionConfig(is_level="token", is_cap=2.0),
    "sequence IS": RolloutCorrectionConfig(is_level="sequence", is_cap=1.0),
    "token band": RolloutCorrectionConfig(token_mask_band=(0.8, 1.25)),
    "sequence band": RolloutCorrectionConfig(seq_mask_band=(0.9, 1.1)),
    "sequence band of width 0": RolloutCorrectionConfig(seq_mask_band=(1.0, 1.0)),
    "all at once": RolloutCorrectionConfig(
        is_level="sequence", is_cap=1.5, token_mask_band=(0.7, 1.4), seq_mask_band=(0.85, 1.15)
    ),
}


def _tokens(seed: int = 0, n_seq: int = 4, seq_len: int = 6) -> dict[str, torch.Tensor]:
    """Random tokens of ``n_seq`` sequences, garbage (NaN / inf) at non-loss positions."""
    g = torch.Generator().manual_seed(seed)
    t = n_seq * seq_len
    mask = (torch.rand(t, generator=g) > 0.3).float()  # (T,)
    mask[::seq_len] = 0.0  # each row starts with a prompt token
    mask[1::seq_len] = 1.0  # and has at least one loss token
    proximal = -torch.rand(t, generator=g) * 3 - 0.1  # (T,)
    current = proximal + 0.3 * torch.randn(t, generator=g)  # (T,) ratios around 1, some clipped
    behavior = proximal + 0.2 * torch.randn(t, generator=g)  # (T,)
    advantages = torch.randn(t, generator=g)  # (T,)
    ref = proximal + 0.1 * torch.randn(t, generator=g)  # (T,)
    off = mask == 0
    for x, bad in ((proximal, float("nan")), (behavior, float("inf")), (advantages, float("nan")), (ref, float("-inf"))):
        x[off] = bad
    seq_ids = torch.arange(n_seq).repeat_interleave(seq_len)  # (T,)
    return {"current": current, "proximal": proximal, "behavior": behavior, "advantages": advantages,
            "ref": ref, "mask": mask, "seq_ids": seq_ids}


def _todays_ppo(log_probs, old, adv, loss_mask, mode, n_tokens, n_seqs, seq_ids, low=0.2, high=0.2):
    """The PPO-clip loss as the trainer computed it before the decoupled objective (a copy
    of ``policy_loss``'s arithmetic at commit c03bdb7), to pin bitwise equality."""
    mask = loss_mask > 0
    zero = torch.zeros(())
    lp = torch.where(mask, log_probs.float(), zero)
    o = torch.where(mask, old.detach().float(), zero)
    a = torch.where(mask, adv.detach().float(), zero)
    log_ratio = (lp - o).clamp(-MAX_ABS_LOG_RATIO, MAX_ABS_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    token_loss = torch.where(mask, torch.maximum(-a * ratio, -a * ratio.clamp(1.0 - low, 1.0 + high)), zero)
    if mode == "token-mean":
        return token_loss.sum() / n_tokens
    n = int(seq_ids.max()) + 1
    seq_sum = torch.zeros(n).index_add(0, seq_ids, token_loss)
    seq_cnt = torch.zeros(n).index_add(0, seq_ids, mask.float())
    per_seq = torch.where(seq_cnt > 0, seq_sum / seq_cnt.clamp(min=1.0), zero) if mode == "seq-mean-token-mean" else seq_sum
    return per_seq.sum() / n_seqs


def _loss_and_grad(d: dict[str, torch.Tensor], **kwargs) -> tuple[torch.Tensor, torch.Tensor, dict]:
    x = d["current"].clone().requires_grad_(True)
    loss, metrics = ppo_loss(x, d["proximal"], d["advantages"], d["mask"], seq_ids=d["seq_ids"], **kwargs)
    loss.backward()
    return loss.detach(), x.grad, metrics


# ---------------------------------------------------------------- decoupled PPO reduces to PPO


@pytest.mark.parametrize("mode", MODES)
def test_without_correction_the_loss_is_bitwise_todays_ppo(mode: str) -> None:
    d = _tokens()
    n_tok, n_seq = float(d["mask"].sum()), 4.0
    x = d["current"].clone().requires_grad_(True)
    ref = _todays_ppo(x, d["proximal"], d["advantages"], d["mask"], mode, n_tok, n_seq, d["seq_ids"], 0.2, 0.28)
    ref.backward()
    ref_grad = x.grad
    loss, grad, m = _loss_and_grad(
        d, loss_agg_mode=mode, global_num_tokens=n_tok, global_num_seqs=n_seq, clip_ratio_high=0.28
    )
    assert torch.equal(loss, ref.detach()), (loss, ref)
    assert torch.equal(grad, ref_grad)
    assert torch.equal(m["actor/pg_loss"], loss) and float(m["actor/kl_loss"]) == 0.0
    assert 0 < float(m["actor/pg_clipfrac"]) < n_tok  # the input does reach the clip range
    # an explicit correction that is off changes nothing either (weights 1, nothing masked)
    off = rollout_correction(d["proximal"], d["behavior"], d["mask"], d["seq_ids"], RolloutCorrectionConfig())
    loss_off, grad_off, _ = _loss_and_grad(
        d, loss_agg_mode=mode, global_num_tokens=n_tok, global_num_seqs=n_seq, clip_ratio_high=0.28, correction=off
    )
    assert torch.equal(loss_off, loss) and torch.equal(grad_off, grad)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_proximal_equal_to_behavior_gives_plain_ppo_for_every_correction(name: str, mode: str) -> None:
    d = _tokens(seed=1)
    cfg = CORRECTIONS[name]
    corr = rollout_correction(d["proximal"], d["proximal"].clone(), d["mask"], d["seq_ids"], cfg)
    on = d["mask"] > 0
    assert torch.equal(corr.weights[on], torch.ones(int(on.sum())))  # exp(0) = 1 exactly
    assert torch.equal(corr.keep, on)
    plain_loss, plain_grad, _ = _loss_and_grad(d, loss_agg_mode=mode, dual_clip_c=3.0)
    loss, grad, _ = _loss_and_grad(d, loss_agg_mode=mode, dual_clip_c=3.0, correction=corr)
    assert torch.equal(loss, plain_loss) and torch.equal(grad, plain_grad)
    metrics = rollout_corr_metrics(corr.sums, corr.gaps)
    assert metrics["rollout_corr/is_weight_mean"] == 1.0 and metrics["rollout_corr/ess"] == 1.0
    assert metrics["rollout_corr/gap_abs_max"] == 0.0 and metrics["rollout_corr/token_masked_frac"] == 0.0


# ---------------------------------------------------------------- dual clip


def test_dual_clip_known_values_for_both_signs_of_the_advantage() -> None:
    # tokens: (A, r) with clip range [0.8, 1.2] and c = 3
    #   0: A=-1, r=4   : max(-A r, -A clip r) = max(4, 1.2) = 4; dual min(4, 3 * 1) = 3   (dual bound binds)
    #   1: A=-1, r=2   : max(2, 1.2) = 2; min(2, 3) = 2                                    (below c: unchanged)
    #   2: A=-2, r=0.5 : max(1.0, 2 * 0.8 = 1.6) = 1.6; min(1.6, 6) = 1.6                  (clipped, not dual)
    #   3: A=+1, r=4   : max(-4, -1.2) = -1.2                                              (A >= 0: unchanged)
    #   4: A=+1, r=0.5 : max(-0.5, -0.8) = -0.5
    adv = torch.tensor([-1.0, -1.0, -2.0, 1.0, 1.0])
    ratio = torch.tensor([4.0, 2.0, 0.5, 4.0, 0.5])
    prox = torch.full((5,), -2.0)
    x = (prox + ratio.log()).requires_grad_(True)
    mask = torch.ones(5)
    loss, m = ppo_loss(x, prox, adv, mask, dual_clip_c=3.0, loss_agg_mode="seq-mean-token-sum",
                       seq_ids=torch.arange(5), global_num_seqs=1.0)
    # seq-mean-token-sum over one-token sequences with normaliser 1: the sum of per-token losses
    assert float(loss.detach()) == pytest.approx(3.0 + 2.0 + 1.6 - 1.2 - 0.5, abs=1e-6)
    loss.backward()
    # d/dlogp of -A r is -A r on the unclipped branch, 0 on a clipped or dual-bounded one
    torch.testing.assert_close(x.grad, torch.tensor([0.0, 2.0, 0.0, 0.0, -0.5]), atol=1e-6, rtol=0)
    assert float(m["actor/pg_clipfrac_dual"]) == 1.0  # token 0 only (a sum over tokens)
    assert float(m["actor/pg_clipfrac"]) == 2.0  # tokens 2 and 3: the clipped term is the larger
    # without dual clip token 0 costs 4 and keeps its gradient
    x2 = (prox + ratio.log()).requires_grad_(True)
    loss2, m2 = ppo_loss(x2, prox, adv, mask, loss_agg_mode="seq-mean-token-sum", seq_ids=torch.arange(5), global_num_seqs=1.0)
    assert float(loss2.detach()) == pytest.approx(4.0 + 2.0 + 1.6 - 1.2 - 0.5, abs=1e-6)
    loss2.backward()
    assert float(x2.grad[0]) == pytest.approx(4.0) and float(m2["actor/pg_clipfrac_dual"]) == 0.0


def test_dual_clip_constant_must_exceed_one() -> None:
    t = torch.zeros(3)
    for c in (1.0, 0.5, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="dual_clip_c="):
            ppo_loss(t, t, t, torch.ones(3), dual_clip_c=c)


# ---------------------------------------------------------------- KL estimators


def test_kl_estimators_known_values_and_gradients() -> None:
    # The estimates and their formulas' derivatives (not the KL's gradient: a loss takes
    # kl_loss_term, tests/unit/trainer/test_kl_gradient.py).
    # d = log current - log ref. Token 0: current 0.5, ref 0.25, d = ln 2 = 0.693147.
    #   k1 = d = 0.693147                 grad 1
    #   k2 = d^2 / 2 = 0.240227           grad d = 0.693147
    #   k3 = exp(-d) - 1 + d = 0.5 - 1 + 0.693147 = 0.193147      grad 1 - exp(-d) = 0.5
    # Token 1: current 0.25, ref 0.5, d = -ln 2.
    #   k1 = -0.693147 (grad 1); k2 = 0.240227 (grad -0.693147);
    #   k3 = 2 - 1 - 0.693147 = 0.306853 (grad 1 - 2 = -1)
    # Token 2: equal log-probs, d = 0: all three 0, gradients 1, 0, 0.
    ln2 = math.log(2.0)
    ref = torch.tensor([math.log(0.25), math.log(0.5), -1.0])
    expected = {
        "k1": ([ln2, -ln2, 0.0], [1.0, 1.0, 1.0]),
        "k2": ([0.240227, 0.240227, 0.0], [ln2, -ln2, 0.0]),
        "k3": ([0.193147, 0.306853, 0.0], [0.5, -1.0, 0.0]),
    }
    for est, (values, grads) in expected.items():
        lp = torch.tensor([math.log(0.5), math.log(0.25), -1.0], requires_grad=True)
        k = kl_penalty(lp, ref, est)
        assert k.dtype == torch.float32 and k.shape == (3,)
        torch.testing.assert_close(k.detach(), torch.tensor(values), atol=1e-6, rtol=0)
        k.sum().backward()
        torch.testing.assert_close(lp.grad, torch.tensor(grads), atol=1e-6, rtol=0)


def test_k1_and_k3_are_unbiased_and_k3_nonnegative_on_samples() -> None:
    # KL(p || q) for two categoricals, estimated from samples of p (the current policy).
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    q = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1])
    true_kl = float((p * (p / q).log()).sum())
    g = torch.Generator().manual_seed(0)
    s = torch.multinomial(p, 200_000, replacement=True, generator=g)
    lp, lq = p.log()[s], q.log()[s]
    assert float(kl_penalty(lp, lq, "k1").mean()) == pytest.approx(true_kl, abs=3e-3)
    k3 = kl_penalty(lp, lq, "k3")
    assert float(k3.mean()) == pytest.approx(true_kl, abs=3e-3) and float(k3.min()) >= 0.0


def test_kl_clamps_the_log_ratio_and_refuses_bad_input() -> None:
    k = kl_penalty(torch.tensor([0.0, -200.0]), torch.tensor([-200.0, 0.0]), "k3")
    assert torch.isfinite(k).all()  # exp(200) would be inf in fp32; d is clamped to +-20
    assert float(k[1]) == pytest.approx(math.exp(20.0) - 1 - 20.0, rel=1e-6)
    with pytest.raises(ConfigError, match="'k4'"):
        kl_penalty(torch.zeros(2), torch.zeros(2), "k4")  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="ref_log_probs"):
        kl_penalty(torch.zeros(2), torch.zeros(3))


def test_kl_term_in_the_loss_uses_the_same_aggregation() -> None:
    # two sequences: (ln 2 on one loss token), (0, -ln 2 on two loss tokens); k3 per token
    # 0.193147, 0, 0.306853. Advantages 0: the pg term is 0, only coef * agg(k3) remains.
    ln2 = math.log(2.0)
    lp = torch.tensor([0.0, -1.0, -2.0, -1.0, -1.0 - ln2])
    ref = torch.tensor([5.0, -1.0 - ln2, 7.0, -1.0, -1.0])
    mask = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0])
    seq_ids = torch.tensor([0, 0, 1, 1, 1])
    adv = torch.zeros(5)
    k3 = [0.193147, 0.0, 0.306853]
    expected = {
        "token-mean": 0.1 * sum(k3) / 3,  # 0.016667
        "seq-mean-token-mean": 0.1 * (k3[0] + (k3[1] + k3[2]) / 2) / 2,  # 0.017328
        "seq-mean-token-sum": 0.1 * (k3[0] + k3[1] + k3[2]) / 2,  # 0.025
    }
    for mode, value in expected.items():
        x = lp.clone().requires_grad_(True)
        loss, m = ppo_loss(x, lp, adv, mask, seq_ids=seq_ids, loss_agg_mode=mode, ref_log_probs=ref, kl_coef=0.1)
        assert float(loss.detach()) == pytest.approx(value, abs=1e-6)
        assert float(m["actor/kl_loss"]) == pytest.approx(value, abs=1e-6) and float(m["actor/pg_loss"]) == 0.0
        assert float(m["kl/ref_k3"]) == pytest.approx(sum(k3), abs=1e-6)  # a sum over loss tokens
        assert float(m["kl/ref_k1"]) == pytest.approx(ln2 + 0.0 - ln2, abs=1e-6)
        loss.backward()
        if mode == "token-mean":  # the term's gradient is d (of KL(current || ref)): ln 2, 0, -ln 2; times 0.1 / 3
            torch.testing.assert_close(x.grad, torch.tensor([0.0, ln2, 0.0, 0.0, -ln2]) * 0.1 / 3, atol=1e-7, rtol=0)
    with pytest.raises(ContractError, match="ref_log_probs"):
        ppo_loss(lp, lp, adv, mask, kl_coef=0.1)
    with pytest.raises(ConfigError, match="kl_coef=-0.1"):
        ppo_loss(lp, lp, adv, mask, ref_log_probs=ref, kl_coef=-0.1)


# ---------------------------------------------------------------- rollout correction


def test_token_truncated_is_known_values() -> None:
    # log w = proximal - behavior = [ln 3, ln 0.5, 0, (not a loss token)]; cap 2
    # weights min(w, 2) = [2, 0.5, 1]; one of three cut at the cap.
    # is_weight_mean = 3.5 / 3 = 1.166667; ess = 3.5^2 / (3 * (4 + 0.25 + 1)) = 12.25 / 15.75 = 0.777778
    behavior = torch.tensor([-2.0, -2.0, -2.0, 0.0])
    proximal = behavior + torch.tensor([math.log(3.0), math.log(0.5), 0.0, 9.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    corr = rollout_correction(proximal, behavior, mask, torch.zeros(4, dtype=torch.long),
                              RolloutCorrectionConfig(is_level="token", is_cap=2.0))
    torch.testing.assert_close(corr.weights, torch.tensor([2.0, 0.5, 1.0, 1.0]), atol=1e-6, rtol=0)
    m = rollout_corr_metrics(corr.sums, corr.gaps)
    assert m["rollout_corr/is_weight_mean"] == pytest.approx(3.5 / 3, abs=1e-6)
    assert m["rollout_corr/is_clipped_frac"] == pytest.approx(1 / 3)
    assert m["rollout_corr/ess"] == pytest.approx(12.25 / 15.75, abs=1e-6)
    assert m["rollout_corr/gap_abs_mean"] == pytest.approx((math.log(3) + math.log(2)) / 3, abs=1e-6)
    assert m["rollout_corr/gap_abs_max"] == pytest.approx(math.log(3), abs=1e-6)
    # the policy-gradient term is weighted: A = 1 at ratio 1 gives -w per token, mean over 3
    t = behavior.clone()
    loss, _ = ppo_loss(t, t, torch.ones(4), mask, correction=corr)
    assert float(loss) == pytest.approx(-(2.0 + 0.5 + 1.0) / 3, abs=1e-6)


def test_sequence_is_is_a_product_of_ratios_truncated_at_the_cap() -> None:
    # sequence 0: w = 1.5, 1.2 -> W = exp(ln 1.5 + ln 1.2) = 1.8 (a sum of ratios would give 2.7)
    # sequence 1: w = 2, 2   -> W = 4, cut to the cap 2.5
    # sequence 2: one prompt token only: no weight, not counted
    behavior = torch.full((7,), -1.0)
    lw = torch.tensor([0.0, math.log(1.5), math.log(1.2), math.log(2.0), math.log(2.0), 0.0, 0.0])
    mask = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    seq_ids = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    corr = rollout_correction(behavior + lw, behavior, mask, seq_ids, RolloutCorrectionConfig(is_level="sequence", is_cap=2.5))
    torch.testing.assert_close(corr.weights, torch.tensor([1.0, 1.8, 1.8, 2.5, 2.5, 1.0, 1.0]), atol=1e-6, rtol=0)
    m = rollout_corr_metrics(corr.sums, corr.gaps)
    # weight units are sequences: mean (1.8 + 2.5) / 2, one of two cut, ess 4.3^2 / (2 * (3.24 + 6.25))
    assert m["rollout_corr/is_weight_mean"] == pytest.approx(2.15, abs=1e-6)
    assert m["rollout_corr/is_clipped_frac"] == pytest.approx(0.5)
    assert m["rollout_corr/ess"] == pytest.approx(4.3**2 / (2 * 9.49), abs=1e-6)
    # a very long sequence whose summed log-ratio overflows exp() in fp32 still gets the cap
    long = torch.full((200,), 0.5)
    big = rollout_correction(long, torch.zeros(200), torch.ones(200), torch.zeros(200, dtype=torch.long),
                             RolloutCorrectionConfig(is_level="sequence", is_cap=2.0))
    assert torch.equal(big.weights, torch.full((200,), 2.0))


def test_token_band_masks_tokens_without_changing_the_normaliser() -> None:
    # w = [3, 0.4, 1, 1.9] with band [0.5, 2]: tokens 0 and 1 masked, 2 and 3 kept.
    # A = 1 at ratio 1: token loss -1; token-mean over all 4 loss tokens: (-1 - 1) / 4 = -0.5
    behavior = torch.full((4,), -1.0)
    proximal = behavior + torch.tensor([3.0, 0.4, 1.0, 1.9]).log()
    mask = torch.ones(4)
    corr = rollout_correction(proximal, behavior, mask, torch.zeros(4, dtype=torch.long),
                              RolloutCorrectionConfig(token_mask_band=(0.5, 2.0)))
    assert corr.keep.tolist() == [False, False, True, True]
    x = proximal.clone().requires_grad_(True)
    loss, m = ppo_loss(x, proximal, torch.ones(4), mask, correction=corr)
    assert float(loss.detach()) == pytest.approx(-0.5, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(x.grad, torch.tensor([0.0, 0.0, -0.25, -0.25]), atol=1e-7, rtol=0)
    assert float(m["actor/ratio_mean"]) == pytest.approx(4.0)  # ratios still reported on all loss tokens
    metrics = rollout_corr_metrics(corr.sums, corr.gaps)
    assert metrics["rollout_corr/token_masked_frac"] == 0.5 and metrics["rollout_corr/seq_masked_frac"] == 0.0


def test_sequence_band_uses_the_geometric_mean() -> None:
    # seq 0: w = 2, 0.5 -> geometric mean 1 (kept, though each token is far out)
    # seq 1: w = 1.2, 1.2 -> geometric mean 1.2 (masked by [0.9, 1.1])
    # seq 2: w = 1.05, 1.0, 0.9 -> exp((ln 1.05 + ln 0.9) / 3) = 0.9813 (kept)
    behavior = torch.full((7,), -1.0)
    w = torch.tensor([2.0, 0.5, 1.2, 1.2, 1.05, 1.0, 0.9])
    seq_ids = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    corr = rollout_correction(behavior + w.log(), behavior, torch.ones(7), seq_ids,
                              RolloutCorrectionConfig(seq_mask_band=(0.9, 1.1)))
    assert corr.keep.tolist() == [True, True, False, False, True, True, True]
    m = rollout_corr_metrics(corr.sums, corr.gaps)
    assert m["rollout_corr/seq_masked_frac"] == pytest.approx(1 / 3)
    assert m["rollout_corr/token_masked_frac"] == 0.0


def test_weights_carry_no_gradient() -> None:
    proximal = torch.tensor([-1.0, -2.0], requires_grad=True)
    corr = rollout_correction(proximal, torch.tensor([-1.5, -1.5]), torch.ones(2), torch.zeros(2, dtype=torch.long),
                              RolloutCorrectionConfig(is_level="token"))
    assert not corr.weights.requires_grad and not corr.sums.requires_grad and not corr.gaps.requires_grad


def test_gap_quantile_matches_torch_quantile() -> None:
    g = torch.Generator().manual_seed(3)
    for n in (1, 2, 7, 1000):
        v = torch.rand(n, generator=g)
        for q in (0.0, 0.5, 0.99, 1.0):
            assert quantile(v, q) == pytest.approx(float(torch.quantile(v.double(), q)), abs=1e-12)
    assert quantile(torch.zeros(0), 0.99) == 0.0
    with pytest.raises(ConfigError, match="q=1.5"):
        quantile(torch.zeros(3), 1.5)


@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_correction_metrics_do_not_depend_on_the_split(name: str) -> None:
    """Sums added over micro-batches (or ranks), gaps concatenated: the batch's metrics."""
    d = _tokens(seed=2, n_seq=6)
    cfg = CORRECTIONS[name]
    whole = rollout_correction(d["proximal"], d["behavior"], d["mask"], d["seq_ids"], cfg)
    ref = rollout_corr_metrics(whole.sums, whole.gaps)
    sums, gaps, keeps, weights = torch.zeros(len(ROLLOUT_CORR_SUMS), dtype=torch.float64), [], [], []
    for rows in ([0, 1], [2], [3, 4, 5]):
        idx = torch.cat([torch.arange(r * 6, r * 6 + 6) for r in rows])
        sid = torch.unique(d["seq_ids"][idx], return_inverse=True)[1]  # 0-based rows of this call
        part = rollout_correction(d["proximal"][idx], d["behavior"][idx], d["mask"][idx], sid, cfg)
        sums += part.sums
        gaps.append(part.gaps)
        keeps.append(part.keep)
        weights.append(part.weights)
    assert torch.equal(torch.cat(keeps), whole.keep)
    torch.testing.assert_close(torch.cat(weights), whole.weights, atol=1e-6, rtol=0)
    got = rollout_corr_metrics(sums, torch.cat(gaps))
    assert got == pytest.approx(ref, abs=1e-9)
    assert set(ref) == {
        "rollout_corr/gap_abs_mean", "rollout_corr/gap_abs_max", "rollout_corr/gap_abs_p99",
        "rollout_corr/is_weight_mean", "rollout_corr/is_clipped_frac", "rollout_corr/token_masked_frac",
        "rollout_corr/seq_masked_frac", "rollout_corr/ess",
    }
    assert 0.0 < ref["rollout_corr/ess"] <= 1.0


# ---------------------------------------------------------------- the assembled loss


@pytest.mark.parametrize("mode", MODES)
def test_full_loss_gradient_does_not_depend_on_the_split(mode: str) -> None:
    """Every term on (correction, dual clip, KL): micro-batches of 1, 2 or 3 rows with the
    global normalisers give the whole batch's loss and gradient (design.md invariant 5)."""
    d = _tokens(seed=4, n_seq=6)
    cfg = CORRECTIONS["all at once"]
    n_tok, n_seq = float(d["mask"].sum()), 6.0
    kw = dict(loss_agg_mode=mode, global_num_tokens=n_tok, global_num_seqs=n_seq, dual_clip_c=2.0,
              kl_coef=0.05, kl_estimator="k2", clip_ratio_high=0.28)

    def run(parts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        x = d["current"].clone().requires_grad_(True)
        total = torch.zeros(())
        sums: dict[str, float] = {}
        for rows in parts:
            idx = torch.cat([torch.arange(r * 6, r * 6 + 6) for r in rows])
            sid = torch.unique(d["seq_ids"][idx], return_inverse=True)[1]
            corr = rollout_correction(d["proximal"][idx], d["behavior"][idx], d["mask"][idx], sid, cfg)
            loss, m = ppo_loss(x[idx], d["proximal"][idx], d["advantages"][idx], d["mask"][idx], seq_ids=sid,
                               correction=corr, ref_log_probs=d["ref"][idx], **kw)
            total = total + loss
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        total.backward()
        return total.detach(), x.grad, sums

    whole = rollout_correction(d["proximal"], d["behavior"], d["mask"], d["seq_ids"], cfg)
    assert 0 < int(whole.keep.sum()) < n_tok  # the masks act, and leave tokens to train on
    ref_loss, ref_grad, ref_sums = run([[0, 1, 2, 3, 4, 5]])
    assert torch.isfinite(ref_grad).all() and ref_grad.abs().sum() > 0
    assert ref_sums["actor/pg_clipfrac_dual"] + ref_sums["actor/pg_clipfrac"] > 0  # the clips act too
    for parts in ([[0], [1], [2], [3], [4], [5]], [[4, 5], [0, 1], [2, 3]], [[5, 2, 0], [1, 3, 4]]):
        loss, grad, sums = run(parts)
        assert float(loss) == pytest.approx(float(ref_loss), abs=1e-6)
        torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=0)
        assert sums == pytest.approx(ref_sums, abs=1e-5)
    assert set(PPO_TOKEN_SUM_METRICS) | {"actor/pg_loss", "actor/kl_loss", "kl/ref_k1", "kl/ref_k2", "kl/ref_k3"} == set(ref_sums)


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -1e30])
def test_garbage_off_the_loss_mask_changes_nothing_with_every_term_on(garbage: float) -> None:
    d = _tokens(seed=5)
    cfg = CORRECTIONS["all at once"]
    kw = dict(loss_agg_mode="seq-mean-token-mean", dual_clip_c=3.0, kl_coef=0.1)

    def run(fill: float | None) -> tuple[torch.Tensor, torch.Tensor, dict]:
        e = {k: v.clone() for k, v in d.items()}
        off = e["mask"] == 0
        if fill is not None:
            for k in ("current", "proximal", "behavior", "advantages", "ref"):
                e[k][off] = fill
        corr = rollout_correction(e["proximal"], e["behavior"], e["mask"], e["seq_ids"], cfg)
        entropy = torch.where(off, torch.tensor(fill if fill is not None else 0.0), torch.ones(len(off)))
        return _loss_and_grad(e, correction=corr, ref_log_probs=e["ref"], entropy=entropy, **kw)

    loss0, grad0, m0 = run(None)
    loss1, grad1, m1 = run(garbage)
    assert torch.isfinite(loss1) and torch.equal(loss0, loss1) and torch.equal(grad0, grad1)
    assert {k: float(v) for k, v in m0.items()} == {k: float(v) for k, v in m1.items()}


def test_ppo_loss_refuses_bad_arguments() -> None:
    t = torch.zeros(4)
    mask = torch.ones(4)
    with pytest.raises(ContractError, match="proximal_log_probs has shape"):
        ppo_loss(t, torch.zeros(3), t, mask)
    with pytest.raises(ContractError, match="seq_ids"):
        ppo_loss(t, t, t, mask, loss_agg_mode="seq-mean-token-mean")
    with pytest.raises(ConfigError, match="loss_agg_mode='sum'"):
        ppo_loss(t, t, t, mask, loss_agg_mode="sum")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="kl_estimator='k0'"):
        ppo_loss(t, t, t, mask, kl_estimator="k0")  # type: ignore[arg-type]
    corr = rollout_correction(torch.zeros(3), torch.zeros(3), torch.ones(3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ContractError, match="correction.weights"):
        ppo_loss(t, t, t, mask, correction=corr)
    with pytest.raises(ConfigError, match="global_num_tokens=0"):
        ppo_loss(t, t, t, mask, global_num_tokens=0.0)
    with pytest.raises(ContractError, match="behavior_log_probs"):
        rollout_correction(t, torch.zeros(3), mask, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"rollout_correction.is_cap=0.5"):
        rollout_correction(t, t, mask, torch.zeros(4, dtype=torch.long), RolloutCorrectionConfig(is_cap=0.5))
    with pytest.raises(ContractError, match="ROLLOUT_CORR_SUMS"):
        rollout_corr_metrics(torch.zeros(3), torch.zeros(0))


def test_ess_is_zero_not_one_when_every_sequence_weight_underflows() -> None:
    """A long sequence far below the engine's probability: exp(sum of log-ratios) is 0 in
    float32, so the policy-gradient term vanishes. The ESS must say so (0), not report
    the formula's 0/0 as a perfect 1; with nothing weighted (correction off) it stays 1."""
    n = 400
    prox, behav = torch.full((n,), -1.0), torch.zeros(n)  # sum of log w = -400
    mask, seq_ids = torch.ones(n), torch.zeros(n, dtype=torch.long)
    corr = rollout_correction(prox, behav, mask, seq_ids, RolloutCorrectionConfig(is_level="sequence"))
    assert torch.equal(corr.weights, torch.zeros(n))
    m = rollout_corr_metrics(corr.sums, corr.gaps)
    assert m["rollout_corr/ess"] == 0.0 and m["rollout_corr/is_weight_mean"] == 0.0
    off = rollout_correction(prox, behav, mask, seq_ids, None)
    assert rollout_corr_metrics(off.sums, off.gaps)["rollout_corr/ess"] == 1.0
    # one of two sequences underflows: the usual formula, (1 + 0)^2 / (2 * 1) = 0.5
    two = rollout_correction(torch.cat([prox, behav]), torch.cat([behav, behav]), torch.ones(2 * n),
                             torch.cat([seq_ids, seq_ids + 1]), RolloutCorrectionConfig(is_level="sequence"))
    assert rollout_corr_metrics(two.sums, two.gaps)["rollout_corr/ess"] == pytest.approx(0.5)
