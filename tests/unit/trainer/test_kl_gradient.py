"""The KL-to-reference term of the loss has the gradient of KL(current ‖ reference).

The per-token term is evaluated on sampled tokens, so the quantity to check is its
*expected* gradient: enumerate every token of a small vocabulary weighted by the
probability of sampling it (the weights held fixed: they are the sampling distribution,
not part of the loss), differentiate with respect to the logits, and compare with the
analytic ``d KL(pi ‖ ref) / d z_j = pi_j (d_j - KL)``, ``d = log pi - log ref``. Then a
Monte Carlo average over tokens drawn from the policy, and the same with tokens drawn from
an older (behavior) policy, where the importance weight current / behavior is what makes
the expectation right.

Four-token set-up: policy logits ``[1.5, 0.5, -0.5, 1.0]``, a uniform reference: ``grad KL(pi ‖ ref) = [0.2116, -0.0965, -0.0997, -0.0154]``, while
differentiating k3 itself gives ``pi - ref = [0.2240, -0.0756, -0.1859, 0.0375]`` (the
gradient of KL(ref ‖ pi)) and differentiating k1 gives 0.
"""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer.config import KL_ESTIMATORS, RolloutCorrectionConfig
from agentrl.trainer.kl import KL_IMPORTANCE_CAP, kl_importance_cap, kl_loss_term, kl_penalty
from agentrl.trainer.losses import ppo_loss, rollout_correction

FOUR_TOKEN_LOGITS = [1.5, 0.5, -0.5, 1.0]
FOUR_TOKEN_REF = [0.25, 0.25, 0.25, 0.25]
FOUR_TOKEN_RIGHT = [0.2116, -0.0965, -0.0997, -0.0154]  # grad KL(pi || ref), 4 decimals
FOUR_TOKEN_WRONG_K3 = [0.2240, -0.0756, -0.1859, 0.0375]  # grad KL(ref || pi) = pi - ref


def _analytic_grad(logits: torch.Tensor, ref_probs: torch.Tensor) -> torch.Tensor:
    """``d KL(softmax(z) ‖ ref) / d z`` in float64: ``pi * (d - KL)``."""
    logp = torch.log_softmax(logits.double(), 0)  # (V,)
    pi = logp.exp()  # (V,)
    d = logp - ref_probs.double().log()  # (V,)
    return pi * (d - (pi * d).sum())  # (V,)


def _token_loss(
    logits: torch.Tensor,
    token: int,
    ref_log_probs: torch.Tensor,
    estimator: str,
    proximal_log_probs: torch.Tensor | None = None,
    behavior_log_probs: torch.Tensor | None = None,
    kl_cap: float = KL_IMPORTANCE_CAP,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``ppo_loss`` of one sampled ``token`` with zero advantage, so only the KL term
    (coefficient 1) remains. Proximal log-probs default to the current ones (first pass);
    behavior log-probs, when given, enter through a token-level rollout correction (cap
    1e6, which then also truncates the KL term's weight, as the trainer passes it);
    without one the KL term's weight is truncated at ``kl_cap``."""
    lp = torch.log_softmax(logits, 0)[token].reshape(1)  # (1,) with grad
    prox = lp.detach() if proximal_log_probs is None else proximal_log_probs[token].reshape(1)  # (1,)
    mask = torch.ones(1)
    correction = None
    if behavior_log_probs is not None:
        cfg = RolloutCorrectionConfig(is_level="token", is_cap=1e6)
        seq_ids = torch.zeros(1, dtype=torch.long)
        correction = rollout_correction(prox, behavior_log_probs[token].reshape(1), mask, seq_ids, cfg)
        kl_cap = kl_importance_cap(cfg)
    return ppo_loss(
        lp, prox, torch.zeros(1), mask, correction=correction, ref_log_probs=ref_log_probs[token].reshape(1),
        kl_coef=1.0, kl_estimator=estimator, kl_importance_cap=kl_cap,
    )


def _expected_grad(
    logits: torch.Tensor, sampling_probs: torch.Tensor, ref_probs: torch.Tensor, estimator: str, **kw
) -> torch.Tensor:
    """``d/dz sum_y q(y) loss(y)`` with the sampling probabilities ``q`` held fixed."""
    z = logits.clone().requires_grad_(True)
    ref_lp = ref_probs.log()  # (V,)
    total = sum(float(sampling_probs[y]) * _token_loss(z, y, ref_lp, estimator, **kw)[0] for y in range(len(logits)))
    total.backward()
    return z.grad.double()


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_expected_gradient_is_that_of_kl_policy_to_reference_on_a_four_token_vocabulary(estimator: str) -> None:
    z = torch.tensor(FOUR_TOKEN_LOGITS)
    ref = torch.tensor(FOUR_TOKEN_REF)
    pi = torch.softmax(z, 0)
    want = _analytic_grad(z, ref)
    torch.testing.assert_close(want, torch.tensor(FOUR_TOKEN_RIGHT, dtype=torch.float64), atol=5e-5, rtol=0)
    got = _expected_grad(z, pi, ref, estimator)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    # the derivative of the estimate itself is the fault this term avoids: for k3 it is
    # the gradient of KL(ref || pi), for k1 zero
    x = z.clone().requires_grad_(True)
    logp = torch.log_softmax(x, 0)
    raw = (pi * kl_penalty(logp, ref.log(), estimator)).sum()
    raw.backward()
    if estimator == "k3":
        wrong = torch.tensor(FOUR_TOKEN_WRONG_K3, dtype=torch.float64)
        torch.testing.assert_close(x.grad.double(), wrong, atol=5e-5, rtol=0)
    if estimator == "k1":
        assert float(x.grad.abs().max()) < 1e-6


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_expected_gradient_on_a_random_sixteen_token_vocabulary(estimator: str) -> None:
    g = torch.Generator().manual_seed(3)
    z = torch.randn(16, generator=g) * 1.5
    ref = torch.softmax(torch.randn(16, generator=g), 0)
    got = _expected_grad(z, torch.softmax(z, 0), ref, estimator)
    torch.testing.assert_close(got, _analytic_grad(z, ref), atol=1e-6, rtol=0)


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_the_value_is_the_estimate_itself(estimator: str) -> None:
    z = torch.tensor(FOUR_TOKEN_LOGITS, requires_grad=True)
    ref_lp = torch.tensor(FOUR_TOKEN_REF).log()
    for y in range(4):
        loss, m = _token_loss(z, y, ref_lp, estimator)
        k = kl_penalty(torch.log_softmax(z.detach(), 0)[y].reshape(1), ref_lp[y].reshape(1), estimator)
        assert torch.equal(loss.detach().reshape(1), k) and torch.equal(m["actor/kl_loss"].reshape(1), k)
        assert float(m[f"kl/ref_{estimator}"]) == float(k)


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_off_policy_tokens_are_importance_weighted(estimator: str) -> None:
    """Tokens drawn from older policies: the expectation over the behavior policy of the
    term's gradient is still that of KL(current ‖ reference) at the current policy, both
    when the proximal policy is the behavior one (a later pass over the batch, ratio
    current / proximal) and with a rollout correction (proximal / behavior on top), as
    long as no weight reaches the truncation (here current / proximal is up to 2.8, so the
    first case lifts the default cap of 2; ``test_importance_weight_is_truncated``)."""
    z = torch.tensor(FOUR_TOKEN_LOGITS)
    ref = torch.tensor(FOUR_TOKEN_REF)
    want = _analytic_grad(z, ref)
    older = torch.tensor([0.2, 1.0, 0.3, 0.6])  # proximal logits: the policy the update started from
    oldest = torch.tensor([-0.4, 1.2, 0.9, 0.1])  # behavior logits: the engine's, a version earlier still
    prox_lp, behav_lp = torch.log_softmax(older, 0), torch.log_softmax(oldest, 0)
    got = _expected_grad(z, prox_lp.exp(), ref, estimator, proximal_log_probs=prox_lp, kl_cap=1e6)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    got = _expected_grad(z, behav_lp.exp(), ref, estimator, proximal_log_probs=prox_lp, behavior_log_probs=behav_lp)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_monte_carlo_average_over_sampled_tokens(estimator: str) -> None:
    """200,000 tokens drawn from the policy (seed 0), one ``ppo_loss`` over all of them
    (token-mean): the gradient is within 0.006 of the analytic one on every logit. The
    per-token gradient ``d_y (onehot_y - pi)`` has a standard deviation of at most 0.31
    per coordinate here, so the average's is at most 0.0007 and 0.006 is over 8 of them;
    the k3 fault is 0.086 off on the third logit, the k1 fault 0.21 on the first."""
    z = torch.tensor(FOUR_TOKEN_LOGITS, requires_grad=True)
    ref_lp = torch.tensor(FOUR_TOKEN_REF).log()
    g = torch.Generator().manual_seed(0)
    n = 200_000
    y = torch.multinomial(torch.softmax(z.detach(), 0), n, replacement=True, generator=g)  # (n,)
    lp = torch.log_softmax(z, 0)[y]  # (n,)
    loss, m = ppo_loss(
        lp, lp.detach(), torch.zeros(n), torch.ones(n), ref_log_probs=ref_lp[y], kl_coef=1.0, kl_estimator=estimator
    )
    loss.backward()
    want = _analytic_grad(z.detach(), ref_lp.exp())
    torch.testing.assert_close(z.grad.double(), want, atol=6e-3, rtol=0)
    if estimator != "k2":  # k1 and k3 estimate the KL without bias
        kl = float((torch.softmax(z.detach(), 0) * (torch.log_softmax(z.detach(), 0) - ref_lp)).sum())
        assert float(m["actor/kl_loss"]) == pytest.approx(kl, abs=3e-3)


def test_kl_loss_term_gradient_and_refusals() -> None:
    # d = [ln 2, -ln 2, 0]; weights [1, 2, 3]: gradient rho * d, value k3 = [0.193147, 0.306853, 0]
    ln2 = math.log(2.0)
    lp = torch.tensor([math.log(0.5), math.log(0.25), -1.0], requires_grad=True)
    ref = torch.tensor([math.log(0.25), math.log(0.5), -1.0])
    term = kl_loss_term(lp, ref, "k3", importance_weights=torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(term.detach(), torch.tensor([0.193147, 0.306853, 0.0]), atol=1e-6, rtol=0)
    term.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([ln2, -2 * ln2, 0.0]), atol=1e-6, rtol=0)
    with pytest.raises(ContractError, match="importance_weights has shape"):
        kl_loss_term(lp, ref, "k3", importance_weights=torch.ones(2))
    with pytest.raises(ConfigError, match="'k9'"):
        kl_loss_term(lp, ref, "k9")  # type: ignore[arg-type]


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_importance_weight_is_truncated(estimator: str) -> None:
    """A later PPO epoch: the current policy put e^5 times the proximal probability on the
    first sampled token. Its KL gradient coefficient is ``min(r w, c) d`` with ``c`` the
    default ``KL_IMPORTANCE_CAP`` (2), not ``e^5 d`` (148 d); a token under the cap keeps
    ``r w d``; the value (the estimate) does not change. With token-level importance weights
    the cap is the rollout correction's ``is_cap`` (3 here)."""
    ln2 = math.log(2.0)
    lp = torch.tensor([math.log(0.5), math.log(0.25)], requires_grad=True)  # current
    prox = lp.detach() - torch.tensor([5.0, 0.0])  # (2,) ratio current / proximal: e^5, 1
    ref = torch.tensor([math.log(0.25), math.log(0.5)])  # d = [ln 2, -ln 2]
    kw = dict(ref_log_probs=ref, kl_coef=1.0, kl_estimator=estimator)
    loss, m = ppo_loss(lp, prox, torch.zeros(2), torch.ones(2), **kw)
    loss.backward()
    # token-mean over 2 tokens: coefficient / 2
    torch.testing.assert_close(lp.grad, torch.tensor([KL_IMPORTANCE_CAP * ln2 / 2, -ln2 / 2]), atol=1e-6, rtol=0)
    k = kl_penalty(lp.detach(), ref, estimator)  # (2,)
    torch.testing.assert_close(m["actor/kl_loss"], k.mean(), atol=1e-7, rtol=0)

    cfg = RolloutCorrectionConfig(is_level="token", is_cap=3.0)
    behav = prox - torch.tensor([0.0, ln2])  # (2,) w = proximal / behavior = [1, 2]
    corr = rollout_correction(prox, behav, torch.ones(2), torch.zeros(2, dtype=torch.long), cfg)
    lp.grad = None
    loss, _ = ppo_loss(lp, prox, torch.zeros(2), torch.ones(2), correction=corr,
                       kl_importance_cap=kl_importance_cap(cfg), **kw)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([3.0 * ln2 / 2, -2.0 * ln2 / 2]), atol=1e-6, rtol=0)


def test_truncated_expected_gradient_on_a_four_token_vocabulary() -> None:
    """The bias the cap buys: tokens drawn from a proximal policy that the current one has
    moved away from (current / proximal up to 2.8), weights cut at 2. The expected gradient
    is ``sum_y q(y) min(pi(y) / q(y), 2) d(y) (onehot_y - pi)``: the first token's weight
    2.76 is cut to 2, which moves the gradient off the untruncated (right) one by 0.044 on
    the first logit ([0.168, -0.082, -0.094, 0.009] against [0.212, -0.097, -0.100, -0.015])."""
    z = torch.tensor(FOUR_TOKEN_LOGITS)
    ref = torch.tensor(FOUR_TOKEN_REF)
    q = torch.softmax(torch.tensor([0.2, 1.0, 0.3, 0.6]), 0).double()  # (V,) proximal = sampling
    got = _expected_grad(z, q.float(), ref, "k3", proximal_log_probs=q.float().log())
    pi = torch.softmax(z.double(), 0)  # (V,)
    d = pi.log() - ref.double().log()  # (V,)
    rho = torch.minimum(pi / q, torch.full_like(q, KL_IMPORTANCE_CAP))  # (V,)
    want = sum(q[y] * rho[y] * d[y] * (torch.eye(4, dtype=torch.float64)[y] - pi) for y in range(4))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    exact = _analytic_grad(z, ref)
    assert float((pi / q).max()) > KL_IMPORTANCE_CAP  # the case cuts a weight
    assert float((got - exact).abs().max()) == pytest.approx(0.0439, abs=5e-4)


def test_kl_importance_cap_follows_the_rollout_correction() -> None:
    assert kl_importance_cap(RolloutCorrectionConfig()) == KL_IMPORTANCE_CAP
    assert kl_importance_cap(RolloutCorrectionConfig(token_mask_band=(0.5, 2.0), is_cap=7.0)) == KL_IMPORTANCE_CAP
    assert kl_importance_cap(RolloutCorrectionConfig(is_level="token", is_cap=3.0)) == 3.0
    assert kl_importance_cap(RolloutCorrectionConfig(is_level="sequence", is_cap=5.0)) == 5.0
    t = torch.zeros(2)
    for bad in (0.5, float("inf"), True):
        with pytest.raises(ConfigError, match=f"kl_importance_cap={bad!r}"):
            ppo_loss(t, t, t, torch.ones(2), kl_importance_cap=bad)  # type: ignore[arg-type]
