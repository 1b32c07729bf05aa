"""Pure tests of agentrl.trainer.losses (no model, no process group)."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer.losses import entropy_from_logits, logprobs_from_logits, ppo_loss

# ---------------------------------------------------------------- log-probs and entropy


def test_C04_logprob_of_token0_at_temperature_half() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    lp = logprobs_from_logits(logits, torch.tensor([0]), temperature=0.5)
    assert lp.dtype == torch.float32
    assert lp.shape == (1,)
    assert lp.item() == pytest.approx(-0.14508, abs=1e-5)
    # and not the unscaled value (T ignored would give log_softmax([2,1,0,-1])[0] = -0.4402)
    assert logprobs_from_logits(logits, torch.tensor([0]), temperature=1.0).item() == pytest.approx(-0.44019, abs=1e-5)


def test_C04_entropy_uses_the_same_scaled_logits() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = torch.softmax(torch.tensor([4.0, 2.0, 0.0, -2.0]), dim=-1)  # logits / 0.5
    expected = float(-(p * p.log()).sum())
    h = entropy_from_logits(logits, temperature=0.5)
    assert h.item() == pytest.approx(expected, abs=1e-6)
    assert h.item() == pytest.approx(0.45543, abs=1e-5)
    p1 = torch.softmax(logits[0], dim=-1)
    assert h.item() != pytest.approx(float(-(p1 * p1.log()).sum()), abs=1e-3)


def test_logprobs_match_log_softmax_gather_for_all_labels() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 50, generator=g) * 3
    labels = torch.randint(0, 50, (37,), generator=g)
    for t in (0.6, 1.0, 1.5):
        ref = torch.log_softmax(logits / t, dim=-1).gather(-1, labels[:, None]).squeeze(-1)
        torch.testing.assert_close(logprobs_from_logits(logits, labels, t), ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("chunk_tokens", [1, 3, 8, 1000])
def test_chunking_changes_neither_values_nor_gradients(chunk_tokens: int) -> None:
    g = torch.Generator().manual_seed(1)
    base = torch.randn(11, 17, generator=g)
    labels = torch.randint(0, 17, (11,), generator=g)
    weights = torch.randn(11, generator=g)

    def run(chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = base.clone().requires_grad_(True)
        lp = logprobs_from_logits(x, labels, 0.7, chunk_tokens=chunk)
        (lp * weights).sum().backward()
        ent = entropy_from_logits(x.detach(), 0.7, chunk_tokens=chunk)
        return lp.detach(), x.grad, ent

    ref_lp, ref_grad, ref_ent = run(10_000)
    lp, grad, ent = run(chunk_tokens)
    torch.testing.assert_close(lp, ref_lp, atol=1e-6, rtol=0)
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=0)
    # gradient of sum_t w_t * log p_t wrt logits: w_t * (onehot - softmax) / T
    p = torch.softmax(base / 0.7, dim=-1)
    expected = weights[:, None] * (torch.nn.functional.one_hot(labels, 17).float() - p) / 0.7
    torch.testing.assert_close(grad, expected, atol=1e-6, rtol=0)


def test_bf16_logits_are_scored_in_fp32() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.bfloat16)
    lp = logprobs_from_logits(logits, torch.tensor([0]), temperature=0.5)
    assert lp.dtype == torch.float32
    assert lp.item() == pytest.approx(-0.14508, abs=1e-5)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_temperature_is_refused(temperature: float) -> None:
    with pytest.raises(ConfigError, match="temperature"):
        logprobs_from_logits(torch.zeros(1, 4), torch.tensor([0]), temperature)
    with pytest.raises(ConfigError, match="temperature"):
        entropy_from_logits(torch.zeros(1, 4), temperature)


def test_shape_mismatch_is_refused() -> None:
    with pytest.raises(ContractError, match=r"\[T, V\]"):
        logprobs_from_logits(torch.zeros(3, 4), torch.tensor([0, 1]), 1.0)
    with pytest.raises(ConfigError, match="chunk_tokens"):
        logprobs_from_logits(torch.zeros(3, 4), torch.tensor([0, 1, 2]), 1.0, chunk_tokens=0)


# ---------------------------------------------------------------- policy loss (ppo_loss without correction, dual clip
# or KL: plain PPO-clip; its metrics are sums over the call's loss tokens)


def _c06_tokens() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequence A: 1 loss token with loss 1; sequence B: 3 loss tokens with loss 3 each.

    At ratio 1 the PPO token loss is -A_t, so advantages -1 and -3 give those losses. Each
    sequence starts with a prompt token (loss_mask 0) holding garbage advantages'
    neighbours to make sure they are ignored."""
    log_probs = torch.tensor([0.0, -1.2, 0.0, -0.5, -0.7, -2.0])
    advantages = torch.tensor([0.0, -1.0, 0.0, -3.0, -3.0, -3.0])
    mask = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    seq_ids = torch.tensor([0, 0, 1, 1, 1, 1])
    return log_probs, advantages, mask, seq_ids


def _grad_of_split(parts: list[list[int]], *, mode: str = "token-mean") -> tuple[float, torch.Tensor]:
    """Sum the loss over micro-batches holding the given token index groups (each micro-
    batch normalised by the global counts), return (loss, d loss / d log_probs)."""
    log_probs, advantages, mask, seq_ids = _c06_tokens()
    x = log_probs.clone().requires_grad_(True)
    total = torch.zeros(())
    for idx in parts:
        i = torch.tensor(idx)
        loss, _ = ppo_loss(
            x[i],
            log_probs[i],
            advantages[i],
            mask[i],
            loss_agg_mode=mode,
            global_num_tokens=4.0,
            global_num_seqs=2.0,
            seq_ids=seq_ids[i] - seq_ids[i].min(),
        )
        total = total + loss
    total.backward()
    return float(total.detach()), x.grad


def test_C06_token_mean_uses_the_global_token_count() -> None:
    whole = [[0, 1, 2, 3, 4, 5]]
    loss, grad = _grad_of_split(whole)
    assert loss == pytest.approx(2.5, abs=1e-6)  # (1 + 3 * 3) / 4
    # d/dlogp of -A * exp(logp - old) at ratio 1 is -A, divided by 4 global tokens
    torch.testing.assert_close(grad, torch.tensor([0.0, 0.25, 0.0, 0.75, 0.75, 0.75]), atol=1e-7, rtol=0)

    # The fault this guards against: a mean per micro-batch, then a mean of means.
    naive = []
    log_probs, advantages, mask, _ = _c06_tokens()
    for idx in ([0, 1], [2, 3, 4, 5]):
        i = torch.tensor(idx)
        naive.append(float(ppo_loss(log_probs[i], log_probs[i], advantages[i], mask[i])[0]))
    assert sum(naive) / 2 == pytest.approx(2.0)  # wrong answer, so the global count matters


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_C06_gradients_equal_for_micro_batch_sizes_1_2_4_and_two_ranks(mode: str) -> None:
    seq_a, seq_b = [0, 1], [2, 3, 4, 5]
    ref_loss, ref_grad = _grad_of_split([seq_a + seq_b], mode=mode)
    splits = {
        "micro-batch size 1": [seq_a, seq_b],
        "micro-batch size 2": [seq_a + seq_b],
        "micro-batch size 4": [seq_a + seq_b],
        # two ranks: each computes its share with the global counts; FSDP sums the grads
        "rank 0 / rank 1": [seq_b, seq_a],
    }
    for name, parts in splits.items():
        loss, grad = _grad_of_split(parts, mode=mode)
        assert loss == pytest.approx(ref_loss, abs=1e-6), name
        torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=0, msg=name)


def test_seq_mean_modes_known_values() -> None:
    log_probs, advantages, mask, seq_ids = _c06_tokens()
    tm, _ = ppo_loss(log_probs, log_probs, advantages, mask, loss_agg_mode="seq-mean-token-mean", seq_ids=seq_ids)
    ts, _ = ppo_loss(log_probs, log_probs, advantages, mask, loss_agg_mode="seq-mean-token-sum", seq_ids=seq_ids)
    tok, _ = ppo_loss(log_probs, log_probs, advantages, mask, loss_agg_mode="token-mean")
    assert tm.item() == pytest.approx((1.0 + 3.0) / 2)  # mean of per-sequence means
    assert ts.item() == pytest.approx((1.0 + 9.0) / 2)  # mean of per-sequence sums
    assert tok.item() == pytest.approx(10.0 / 4)  # local count when no global one given


def test_sequences_without_loss_tokens_are_not_counted() -> None:
    # seq 0: only prompt tokens; seq 1: two tokens with loss 2
    lp = torch.zeros(4)
    adv = torch.tensor([0.0, 0.0, -2.0, -2.0])
    mask = torch.tensor([0.0, 0.0, 1.0, 1.0])
    loss, _ = ppo_loss(lp, lp, adv, mask, loss_agg_mode="seq-mean-token-mean", seq_ids=torch.tensor([0, 0, 1, 1]))
    assert loss.item() == pytest.approx(2.0)


def test_ppo_clip_known_values_and_metrics() -> None:
    old = torch.zeros(4)
    log_probs = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    mask = torch.ones(4)
    loss, m = ppo_loss(log_probs, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    # token losses: A=+1, r=1.5 -> -1.28 (clipped); A=-1, r=1.5 -> 1.5 (unclipped);
    #               A=+1, r=0.5 -> -0.5 (unclipped); A=-1, r=0.5 -> 0.8 (clipped)
    assert loss.item() == pytest.approx((-1.28 + 1.5 - 0.5 + 0.8) / 4, abs=1e-6)
    loss.backward()
    # gradient only through unclipped tokens: d(-A r)/dlogp = -A r, / 4
    torch.testing.assert_close(log_probs.grad, torch.tensor([0.0, 1.5 / 4, -0.5 / 4, 0.0]), atol=1e-6, rtol=0)
    assert m["actor/pg_clipfrac"].item() == pytest.approx(2.0)  # sums over the 4 loss tokens
    assert m["actor/ratio_mean"].item() == pytest.approx(4.0)
    kl = ((1.5 - 1) - math.log(1.5)) * 2 + ((0.5 - 1) - math.log(0.5)) * 2
    assert m["actor/ppo_kl"].item() == pytest.approx(kl, abs=1e-6)
    assert m["actor/pg_loss"].item() == pytest.approx(loss.item())
    assert m["actor/kl_loss"].item() == 0.0 and m["actor/pg_clipfrac_dual"].item() == 0.0
    assert set(m) == {"actor/pg_loss", "actor/kl_loss", "actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_dual",
                      "actor/entropy", "actor/ratio_mean"}


def test_entropy_metric_is_a_masked_sum() -> None:
    lp = torch.zeros(3)
    _, m = ppo_loss(
        lp, lp, torch.zeros(3), torch.tensor([0.0, 1.0, 1.0]), entropy=torch.tensor([100.0, 1.0, 2.0])
    )
    assert m["actor/entropy"].item() == pytest.approx(3.0)  # 1 + 2 on the loss tokens; the step divides by their count


@pytest.mark.parametrize("garbage", [1e9, -1e9, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_C03_garbage_at_observation_positions_changes_nothing(garbage: float, mode: str) -> None:
    g = torch.Generator().manual_seed(3)
    n = 10
    mask = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1, 1, 0], dtype=torch.float32)
    seq_ids = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
    log_probs = -torch.rand(n, generator=g)
    old = log_probs + 0.1 * torch.randn(n, generator=g)
    adv = torch.where(mask > 0, torch.randn(n, generator=g), torch.zeros(n))

    def run(lp_in: torch.Tensor, old_in: torch.Tensor, adv_in: torch.Tensor):
        x = lp_in.clone().requires_grad_(True)
        loss, m = ppo_loss(x, old_in, adv_in, mask, loss_agg_mode=mode, seq_ids=seq_ids, clip_ratio_high=0.28)
        loss.backward()
        return loss.detach(), m, x.grad

    clean_loss, clean_m, clean_grad = run(log_probs, old, adv)
    off = mask == 0
    dirty_old = torch.where(off, torch.full((n,), garbage), old)
    dirty_adv = torch.where(off, torch.full((n,), garbage), adv)
    dirty_lp = torch.where(off, torch.full((n,), garbage), log_probs)
    loss, m, grad = run(dirty_lp, dirty_old, dirty_adv)
    assert torch.equal(loss, clean_loss)
    assert torch.equal(m["actor/ppo_kl"], clean_m["actor/ppo_kl"])
    assert clean_m["actor/ppo_kl"].item() > 0
    for k in clean_m:
        assert torch.equal(m[k], clean_m[k]), k
    assert torch.isfinite(grad).all()
    assert torch.equal(grad, clean_grad)
    assert torch.equal(grad[off], torch.zeros(int(off.sum())))


def test_huge_log_ratio_does_not_overflow() -> None:
    lp = torch.tensor([0.0], requires_grad=True)
    loss, m = ppo_loss(lp, torch.tensor([-500.0]), torch.tensor([-1.0]), torch.ones(1))
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(lp.grad).all()


def test_plain_ppo_loss_refuses_bad_arguments() -> None:
    x = torch.zeros(3)
    m = torch.ones(3)
    with pytest.raises(ConfigError, match="loss_agg_mode='mean'"):
        ppo_loss(x, x, x, m, loss_agg_mode="mean")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="clip_ratio_low=1.5"):
        ppo_loss(x, x, x, m, clip_ratio_low=1.5)
    with pytest.raises(ConfigError, match="clip_ratio_high=-0.1"):
        ppo_loss(x, x, x, m, clip_ratio_high=-0.1)
    with pytest.raises(ContractError, match="advantages has shape"):
        ppo_loss(x, x, torch.zeros(2), m)
    with pytest.raises(ContractError, match="needs seq_ids"):
        ppo_loss(x, x, x, m, loss_agg_mode="seq-mean-token-mean")
    with pytest.raises(ConfigError, match="global_num_tokens=0"):
        ppo_loss(x, x, x, m, global_num_tokens=0)
