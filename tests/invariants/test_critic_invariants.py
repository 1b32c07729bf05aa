"""CriticTrainer invariants (design.md, invariant 5): the value loss is normalised by the
global turn count, so gradients, updated weights and metrics are the same for any
micro-batch size and for 1 vs 2 ranks.

Real parts only: a real (tiny, random) Llama backbone, real FSDP2, real gloo process
groups (one in-process rank, two spawned ranks).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.trainer import run_critic_cases, run_on_gloo_ranks

pytestmark = pytest.mark.usefixtures("process_group")

TOL = 1e-6  # fp32
# head_init_std > 0 so the backbone gets gradient at the first step. Adam's first step is
# lr * g / (|g| + eps), whose slope near g = 0 is lr / eps: measured here, clipped gradients
# as small as 5e-8 differ by ~1e-8 between micro-batch sizes (summation order), which with
# eps=1e-6 moved a weight by 1.5e-6. eps=1e-4 bounds the amplification at 10x while
# gradients of 1e-3..1e-1 still move weights by about lr, so the weight check stays meaningful.
BASE = {"lr": 1e-3, "max_grad_norm": 1.0, "eps": 1e-4, "head_init_std": 0.1}
METRICS = ("losses/value_loss", "losses/value_clipfrac", "critic/values_mean", "critic/returns_mean",
           "critic/explained_variance", "train/grad_norm", "train/num_value_positions")


def _assert_same(a: dict, b: dict, what: str) -> None:
    torch.testing.assert_close(a["values"], b["values"], atol=TOL, rtol=0, msg=f"{what}: values")
    assert a["grads"].keys() == b["grads"].keys()
    backbone = [k for k in a["grads"] if k.startswith("backbone.")]
    assert backbone and max(float(a["grads"][k].abs().max()) for k in backbone) > 0, f"{what}: no backbone gradient"
    for name in a["grads"]:
        torch.testing.assert_close(a["grads"][name], b["grads"][name], atol=TOL, rtol=0, msg=f"{what}: grad {name}")
    assert a["weights"].keys() == b["weights"].keys()
    for name in a["weights"]:
        torch.testing.assert_close(a["weights"][name], b["weights"][name], atol=TOL, rtol=0, msg=f"{what}: weight {name}")
    for key in METRICS:
        assert a["metrics"][key] == pytest.approx(b["metrics"][key], abs=1e-5), f"{what}: {key}"


@pytest.mark.parametrize("value_clip", [None, 0.2])
def test_critic_gradients_equal_for_micro_batch_sizes_1_2_4(tiny_llama_path: str, value_clip: float | None) -> None:
    batch = {"num_rows": 4, "seed": 7, "with_old_values": True}
    cases = {
        f"mbs{m}": {"batch": batch, "config": {**BASE, "micro_batch_size": m, "value_clip": value_clip}}
        for m in (1, 2, 4)
    }
    res = run_critic_cases(tiny_llama_path, cases)
    assert res["mbs4"]["metrics"]["train/grad_norm"] > 1e-3
    if value_clip is not None:
        assert res["mbs4"]["metrics"]["losses/value_clipfrac"] > 0
    _assert_same(res["mbs1"], res["mbs4"], "micro-batch size 1 vs 4")
    _assert_same(res["mbs2"], res["mbs4"], "micro-batch size 2 vs 4")


TWO_RANK_CASES = {
    # 3 rows per rank, 2 micro-batches each
    "six_rows": {"batch": {"num_rows": 6, "seed": 11}, "config": {**BASE, "micro_batch_size": 2}},
    # rank 0 gets 2 micro-batches, rank 1 one (plus a dummy pass); clipped loss
    "three_rows_clipped": {
        "batch": {"num_rows": 3, "seed": 12, "with_old_values": True},
        "config": {**BASE, "micro_batch_size": 1, "value_clip": 0.2},
    },
    # rank 1 gets no row at all and must still join every collective
    "one_row": {"batch": {"num_rows": 1, "seed": 13, "max_turns": 4}, "config": {**BASE}},
}


def test_critic_gradients_equal_for_one_and_two_ranks(tiny_llama_path: str) -> None:
    two = run_on_gloo_ranks(run_critic_cases, tiny_llama_path, TWO_RANK_CASES)[0]
    one = run_critic_cases(tiny_llama_path, TWO_RANK_CASES)
    assert two.keys() == one.keys() == TWO_RANK_CASES.keys()
    for name in TWO_RANK_CASES:
        assert one[name]["metrics"]["train/grad_norm"] > 1e-3, name
        _assert_same(one[name], two[name], f"1 vs 2 ranks, case {name}")
