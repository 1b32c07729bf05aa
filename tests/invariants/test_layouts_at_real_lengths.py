"""Both row layouts at real lengths, on the packaged model, against a plain forward.

``test_packing_invariants.py`` checks the layouts on rows of 5-14 tokens of a tiny Llama.
Here: SmolLM2-135M-Instruct (the embedded default's model), fp32 on CPU, two rows of 563
and 1,037 tokens in one micro-batch. The reference is a plain Hugging Face forward of each
row alone (its default ``sdpa`` kernel), log-probs ``logit[label] - logsumexp(logits)`` (the
trainer's formula: ``log_softmax`` rounds differently), and the autograd gradient of the
on-policy PPO loss (ratio 1: ``-A log p``, token-mean).

- ``packed`` and ``padded`` with the default kernel (``auto``: per-row SDPA) score every
  row at its own length: log-probs equal the plain forward bit for bit, gradients within
  1e-6 (the head's hand-written backward and the weight gradients' longer sums round
  differently).
- Kernels that attend over the micro-batch's width: ``padded`` rows through transformers'
  ``sdpa`` or ``eager`` kernel (the padded width), ``packed`` rows through ``sdpa`` (a dense
  block-diagonal mask over the packed sequence). Their CPU kernels block the sums by the
  call's length, so they round differently: within ``ATTENTION_WIDTH_LOG_PROB_TOL`` and
  ``ATTENTION_WIDTH_GRAD_TOL`` (``agentrl.trainer.config``, stated for rows of up to about
  1,040 tokens, these lengths), not exactly.

  Measured here: 3.8e-6 / 6.3e-7 (padded, ``sdpa``), 2.5e-5 / 2.7e-6 (padded, ``eager``),
  2.0e-5 / 2.9e-6 (packed, ``sdpa``) in log-probs / gradients.

The plain forward and its gradients (one more model load) are computed once per module
and shared by every case; each case loads its own trainer (the kernel is chosen at load).
Memory: about 9 GB peak RSS (the ``eager`` case keeps every layer's attention weights at
the padded width). Slow: about 140 s on 2 cores (20-30 s per case).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.trainer import PolicyTrainer, TrainerConfig
from agentrl.trainer.config import ATTENTION_WIDTH_GRAD_TOL, ATTENTION_WIDTH_LOG_PROB_TOL
from agentrl.types import SamplingRecord, TokenBatch, TokenSequence
from tests.helpers.trainer import full_grads

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("process_group")]

ROW_LENGTHS = (563, 1037)
GRAD_TOL = 1e-6  # as test_packing_invariants.py


def _batch() -> TokenBatch:
    """Two rows of random token ids (seed 0): a quarter prompt (``loss_mask`` 0), the rest
    sampled tokens with advantage -0.5 (first row) or +1.0 (second)."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, n in enumerate(ROW_LENGTHS):
        ids = torch.randint(0, 49152, (n,), generator=g).tolist()
        mask = [0] * (n // 4) + [1] * (n - n // 4)
        adv = 1.0 if i else -0.5
        rows.append(
            TokenSequence(
                input_ids=ids, loss_mask=mask, behavior_log_probs=[-10.0] * sum(mask),
                advantages=[adv * m for m in mask], group_id="g0", policy_version=0, episode_id=f"ep{i}",
            )
        )
    return TokenBatch.pack(rows, SamplingRecord(temperature=1.0))


@pytest.fixture(scope="module")
def plain(smollm2_path: str) -> dict:
    """Log-probs ``[T]`` (0 at row starts) and parameter gradients of a plain HF forward of
    each row alone."""
    batch = _batch()
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    model.train()  # as the trainer (dropout is 0 in SmolLM2's config)
    lps, terms = [], []
    n_tok = float((batch.loss_mask > 0).sum())
    for s in batch.row_slices():
        ids = batch.input_ids[s]  # (L,)
        logits = model(input_ids=ids[None]).logits[0, :-1]  # (L-1, V)
        lp = logits.gather(-1, ids[1:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (L-1,)
        mask = batch.loss_mask[s][1:] > 0  # (L-1,)
        terms.append(torch.where(mask, -batch.advantages[s][1:] * lp, torch.zeros(())).sum())
        lps.append(torch.cat([torch.zeros(1), lp.detach()]))
        del logits
    (torch.stack(terms).sum() / n_tok).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"batch": batch, "log_probs": torch.cat(lps), "grads": grads}


def _trainer_run(path: str, batch: TokenBatch, layout: str, attn: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    trainer = PolicyTrainer(
        TrainerConfig(
            model_path=path, row_layout=layout, attn_implementation=attn, micro_batch_size=2,
            micro_batch_tokens=4096, max_grad_norm=None, lr=1e-6,
        )
    )
    lp = trainer.compute_log_probs(batch)
    trainer.step(batch)
    return lp, full_grads(trainer)


def _max_grad_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    assert got.keys() == want.keys()
    return max(float((got[n] - want[n]).abs().max()) for n in want)


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_default_kernel_scores_both_layouts_exactly_at_real_lengths(smollm2_path: str, plain: dict, layout: str) -> None:
    lp, grads = _trainer_run(smollm2_path, plain["batch"], layout, "auto")
    diff = float((lp - plain["log_probs"]).abs().max())
    assert torch.equal(lp, plain["log_probs"]), f"{layout}: max |d log p| = {diff}"
    assert _max_grad_diff(grads, plain["grads"]) <= GRAD_TOL


@pytest.mark.parametrize(("layout", "attn"), [("padded", "sdpa"), ("padded", "eager"), ("packed", "sdpa")])
def test_full_width_kernels_keep_the_stated_bound(smollm2_path: str, plain: dict, layout: str, attn: str) -> None:
    lp, grads = _trainer_run(smollm2_path, plain["batch"], layout, attn)
    lp_diff = float((lp - plain["log_probs"]).abs().max())
    grad_diff = _max_grad_diff(grads, plain["grads"])
    print(f"{layout}/{attn}: max |d log p| = {lp_diff:.2e}, max |d grad| = {grad_diff:.2e}")
    assert lp_diff <= ATTENTION_WIDTH_LOG_PROB_TOL, f"{layout}/{attn}: max |d log p| = {lp_diff}"
    assert grad_diff <= ATTENTION_WIDTH_GRAD_TOL, f"{layout}/{attn}: max |d grad| = {grad_diff}"
