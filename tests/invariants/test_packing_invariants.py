"""Packed rows give the padded rows' numbers (design.md, invariant 5).

``row_layout="packed"`` scores a micro-batch as one unpadded sequence with block-diagonal
causal attention, micro-batches bin-packed by ``micro_batch_tokens``, and the LM head run
only where a loss reads. Here: its log-probs equal the padded layout's within 1e-5 and its
gradients within 1e-6 (fp32, CPU), for every loss aggregation mode, across token budgets
and for 1 vs 2 ranks; both equal a plain Hugging Face forward / autograd computed without
the trainer; and cases C04 and C06 (docs/cases.md) hold in both layouts.

Real parts only: a real (tiny, random) Llama, real FSDP2, real gloo groups (one in-process
rank, two spawned ranks).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from agentrl.trainer import PolicyTrainer, TrainerConfig
from agentrl.trainer.config import LOSS_AGG_MODES
from agentrl.types import SamplingRecord, TokenBatch, TokenSequence
from tests.helpers.trainer import full_grads, make_batch, make_tiny_llama, run_on_gloo_ranks, run_trainer_cases

pytestmark = pytest.mark.usefixtures("process_group")

LP_TOL = 1e-5  # log-probs, fp32
GRAD_TOL = 1e-6  # gradients and weights, fp32

# As in test_trainer_invariants.py: eps=1e-6 keeps Adam's first step from amplifying
# 1e-10 rounding differences of near-zero gradients past the tolerance.
BASE = {"lr": 1e-3, "max_grad_norm": 1.0, "eps": 1e-6}

BATCH = {"num_rows": 6, "seed": 31, "temperature": 0.9, "min_len": 5, "max_len": 14}
# make_batch(**BATCH) has rows of 5..14 tokens (49 in all): budget 1000 puts every row of a
# rank in one micro-batch, 20 gives several of 1-3 rows, 1 runs each row alone.
BUDGETS = (1000, 20, 1)

# Packed rows use "auto" (on CPU: the per-row SDPA kernel of agentrl.trainer.packing);
# "sdpa" scores them through transformers' own block-diagonal mask, also exact.
PACKED = {"row_layout": "packed", "attn_implementation": "auto"}
PADDED = {"row_layout": "padded", "attn_implementation": "sdpa"}


@pytest.fixture(scope="module")
def tied_llama_path(tmp_path_factory) -> str:
    """The tiny Llama with ``lm_head`` tied to ``embed_tokens``, as SmolLM2 (both in
    FSDP's root group)."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny_llama_tied"), seed=1, tie_word_embeddings=True)


def _assert_same(a: dict, b: dict, what: str) -> None:
    torch.testing.assert_close(a["log_probs"], b["log_probs"], atol=LP_TOL, rtol=0, msg=f"{what}: log_probs")
    assert a["grads"].keys() == b["grads"].keys(), what
    for name in a["grads"]:
        torch.testing.assert_close(a["grads"][name], b["grads"][name], atol=GRAD_TOL, rtol=0, msg=f"{what}: grad {name}")
    for name in a["weights"]:
        torch.testing.assert_close(a["weights"][name], b["weights"][name], atol=GRAD_TOL, rtol=0, msg=f"{what}: weight {name}")
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/num_loss_tokens"):
        assert a["metrics"][key] == pytest.approx(b["metrics"][key], abs=1e-5), f"{what}: {key}"


def _layout_cases(mode: str) -> dict[str, dict]:
    cases = {"padded_mbs4": {"batch": BATCH, "config": {**BASE, **PADDED, "loss_agg_mode": mode, "micro_batch_size": 4}}}
    for budget in BUDGETS:
        cases[f"packed_{budget}"] = {
            "batch": BATCH,
            "config": {**BASE, **PACKED, "loss_agg_mode": mode, "micro_batch_tokens": budget},
        }
    cases["packed_hf_sdpa_20"] = {
        "batch": BATCH,
        "config": {**BASE, "loss_agg_mode": mode, "row_layout": "packed", "attn_implementation": "sdpa", "micro_batch_tokens": 20},
    }
    return cases


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_packed_equals_padded_across_token_budgets(tiny_llama_path: str, mode: str) -> None:
    res = run_trainer_cases(tiny_llama_path, _layout_cases(mode))
    ref = res["padded_mbs4"]
    assert ref["metrics"]["actor/grad_norm"] > 1e-3  # a real gradient, not trivially equal
    assert ref["metrics"]["perf/padding_frac"] > 0.0
    for name in [f"packed_{b}" for b in BUDGETS] + ["packed_hf_sdpa_20"]:
        got = res[name]
        _assert_same(ref, got, f"{mode}: padded (4 rows) vs {name}")
        assert got["metrics"]["perf/padding_frac"] == 0.0


def test_packed_equals_padded_for_one_and_two_ranks(tiny_llama_path: str, tied_llama_path: str) -> None:
    """Every aggregation mode, packed (two budgets) and padded, on 2 gloo ranks equals 1
    rank; the tied model checks that the head's gradient reaches the shared embedding
    through FSDP's forward-method hooks."""
    cases: dict[str, dict] = {}
    for mode in LOSS_AGG_MODES:
        for budget in (1000, 20):
            cases[f"{mode}_packed_{budget}"] = {
                "batch": BATCH,
                "config": {**BASE, **PACKED, "loss_agg_mode": mode, "micro_batch_tokens": budget},
            }
        cases[f"{mode}_padded"] = {
            "batch": BATCH,
            "config": {**BASE, **PADDED, "loss_agg_mode": mode, "micro_batch_size": 2},
        }
    # one row: rank 1 has nothing and runs dummy passes through the same scorer
    cases["one_row_packed"] = {"batch": {"num_rows": 1, "seed": 13}, "config": {**BASE, **PACKED}}
    tied = {"tied_packed": {"batch": BATCH, "config": {**BASE, **PACKED, "micro_batch_tokens": 20}}}

    two_rank: dict[str, dict] = {}
    for path, group in ((tiny_llama_path, cases), (tied_llama_path, tied)):
        two = run_on_gloo_ranks(run_trainer_cases, path, group)[0]
        one = run_trainer_cases(path, group)
        assert two.keys() == one.keys() == group.keys()
        for name in group:
            assert one[name]["metrics"]["actor/grad_norm"] > 1e-3, name
            _assert_same(one[name], two[name], f"1 vs 2 ranks, {name}")
        two_rank.update(two)
    # and on 2 ranks the layouts agree with each other
    for mode in LOSS_AGG_MODES:
        for budget in (1000, 20):
            _assert_same(two_rank[f"{mode}_padded"], two_rank[f"{mode}_packed_{budget}"], f"2 ranks, {mode}, padded vs packed {budget}")


def test_padded_rows_score_bit_for_bit_like_packed_rows_at_hundreds_of_tokens(tiny_llama_path: str) -> None:
    """Rows of 200-500 tokens, where PyTorch's CPU attention kernel blocks a row's sums
    by the length of the call: the default kernel runs each padded row at its own length,
    so padded log-probs equal packed ones exactly (through a full-width masked call they
    differ by about 5e-7 here; ``test_layouts_at_real_lengths.py`` for the real model)."""
    batch = make_batch(num_rows=4, seed=0, min_len=200, max_len=500)
    got = {}
    for layout in ("packed", "padded"):
        trainer = PolicyTrainer(TrainerConfig(model_path=tiny_llama_path, row_layout=layout, attn_implementation="auto",
                                              micro_batch_size=4, micro_batch_tokens=4096))
        got[layout] = trainer.compute_log_probs(batch)
    assert torch.equal(got["packed"], got["padded"]), float((got["packed"] - got["padded"]).abs().max())


# ---------------------------------------------------------------- against plain Hugging Face


def _hf_reference(model_path: str, batch: TokenBatch, mode: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-row plain HF forward (no trainer code): log-probs ``[T]`` (0 at row starts) and
    the gradient of the on-policy PPO loss (ratio 1, so d loss = -A d log p) aggregated as
    ``mode`` with the batch's global counts."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.train()
    temperature = batch.sampling.temperature
    lps, per_seq, counts = [], [], []
    for s in batch.row_slices():
        ids = batch.input_ids[s]
        logits = model(input_ids=ids[None]).logits[0]  # (L, V)
        logp = torch.log_softmax(logits / temperature, dim=-1)  # (L, V)
        row = torch.cat([torch.zeros(1), logp[:-1].gather(-1, ids[1:, None]).squeeze(-1)])  # (L,)
        lps.append(row)
        mask = batch.loss_mask[s] > 0
        term = torch.where(mask, -batch.advantages[s] * row, torch.zeros(()))  # (L,)
        per_seq.append(term.sum())
        counts.append(int(mask.sum()))
    n_tok = sum(counts)
    n_seq = sum(c > 0 for c in counts)
    if mode == "token-mean":
        loss = torch.stack(per_seq).sum() / n_tok
    elif mode == "seq-mean-token-mean":
        loss = sum(v / c for v, c in zip(per_seq, counts) if c > 0) / n_seq
    else:
        loss = torch.stack(per_seq).sum() / n_seq
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return torch.cat(lps).detach(), grads


@pytest.mark.parametrize("layout,attn", [("packed", "auto"), ("packed", "sdpa"), ("padded", "sdpa"), ("padded", "auto")])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_log_probs_and_gradients_equal_plain_hf(
    tiny_llama_path: str, tied_llama_path: str, layout: str, attn: str, mode: str
) -> None:
    batch = make_batch(**BATCH)
    for path in (tiny_llama_path, tied_llama_path):
        want_lp, want_grads = _hf_reference(path, batch, mode)
        trainer = PolicyTrainer(
            TrainerConfig(
                model_path=path, lr=1e-3, max_grad_norm=None, loss_agg_mode=mode, row_layout=layout,
                attn_implementation=attn, micro_batch_tokens=20, micro_batch_size=2, logprob_chunk_tokens=3,
            )
        )
        torch.testing.assert_close(trainer.compute_log_probs(batch), want_lp, atol=LP_TOL, rtol=0)
        trainer.step(batch)
        got = full_grads(trainer)
        assert got.keys() == want_grads.keys()
        for name, g in want_grads.items():
            torch.testing.assert_close(got[name], g, atol=GRAD_TOL, rtol=0, msg=f"{path} {layout} {mode}: {name}")


# ---------------------------------------------------------------- case C04


C04_LOGITS = torch.tensor([2.0, 1.0, 0.0, -1.0])


def _c04_model(path: Path, first_token: int = 1) -> str:
    """A 4-token-vocabulary Llama whose logits after the token ``first_token`` at a row's
    first position are exactly ``[2, 1, 0, -1]``: ``lm_head`` is set to
    ``C04_LOGITS ⊗ h / |h|^2`` for that position's final hidden state ``h``."""
    cfg = LlamaConfig(
        vocab_size=4, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=64, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        h = model.model(input_ids=torch.tensor([[first_token]])).last_hidden_state[0, 0].double()  # (H,)
        model.lm_head.weight.copy_((C04_LOGITS.double()[:, None] * h[None, :] / h.dot(h)).float())
        got = model(input_ids=torch.tensor([[first_token]])).logits[0, 0]
    assert torch.allclose(got, C04_LOGITS, atol=1e-6), got
    model.save_pretrained(path)
    return str(path)


def _c04_batch(temperature: float) -> TokenBatch:
    """Rows that start with token 1 and have their one loss token right after it (so it
    is predicted by logits [2, 1, 0, -1]), of different lengths so packing and padding
    both matter: row k scores token k % 4."""
    rows = []
    for k, n in enumerate((2, 7, 3, 9, 4, 2)):
        ids = [1, k % 4] + [(k + j) % 4 for j in range(n - 2)]
        mask = [0, 1] + [0] * (n - 2)
        adv = [0.0, 1.0 if k % 2 else -1.0] + [0.0] * (n - 2)
        rows.append(TokenSequence(ids, mask, [-1.0], adv, f"g{k // 2}", 0, f"ep{k}"))
    return TokenBatch.pack(rows, SamplingRecord(temperature=temperature))


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_C04_trainer_log_prob_and_entropy(tmp_path: Path, layout: str) -> None:
    path = _c04_model(tmp_path / "c04")
    for temperature in (0.5, 0.6, 1.0, 1.5):
        batch = _c04_batch(temperature)
        trainer = PolicyTrainer(
            TrainerConfig(model_path=path, **(PACKED if layout == "packed" else PADDED), micro_batch_tokens=12, micro_batch_size=3)
        )
        lp = trainer.compute_log_probs(batch)
        want = torch.log_softmax(C04_LOGITS / temperature, dim=-1)  # (4,)
        for k, s in enumerate(batch.row_slices()):
            assert lp[s.start + 1].item() == pytest.approx(want[k % 4].item(), abs=1e-5), (layout, temperature, k)
        if temperature == 0.5:
            assert lp[batch.row_slices()[0].start + 1].item() == pytest.approx(-0.14508, abs=1e-5)
        m = trainer.step(batch).metrics
        p = torch.softmax(C04_LOGITS / temperature, dim=-1)
        assert m["actor/entropy"] == pytest.approx(float(-(p * p.log()).sum()), abs=1e-5), (layout, temperature)
        if temperature == 0.5:
            assert m["actor/entropy"] == pytest.approx(0.45543, abs=1e-5)


# ---------------------------------------------------------------- case C06


def _c06_batch() -> TokenBatch:
    """Row A: 1 loss token with loss 1; row B: 3 loss tokens with loss 3 each (on-policy
    PPO: ratio 1, so the per-token loss is -advantage)."""
    a = TokenSequence([5, 6], [0, 1], [-1.0], [0.0, -1.0], "gA", 0, "A")
    b = TokenSequence([7, 8, 9, 10], [0, 1, 1, 1], [-1.0] * 3, [0.0, -3.0, -3.0, -3.0], "gB", 0, "B")
    return TokenBatch.pack([a, b], SamplingRecord(temperature=1.0))


def _c06_run(model_path: str, configs: dict[str, dict]) -> dict[str, dict]:
    import torch.distributed as dist

    out = {}
    for name, kw in configs.items():
        trainer = PolicyTrainer(TrainerConfig(model_path=model_path, lr=1e-3, max_grad_norm=None, **kw))
        metrics = trainer.step(_c06_batch()).metrics
        grads = full_grads(trainer)
        if dist.get_rank() == 0:
            out[name] = {"metrics": metrics, "grads": grads}
    return out


def _c06_configs(layout: str) -> dict[str, dict]:
    if layout == "packed":
        # budget 2: A and B alone; 6: both in one micro-batch
        return {f"budget{b}": {**PACKED, "micro_batch_tokens": b} for b in (1, 2, 6, 100)}
    return {f"mbs{m}": {**PADDED, "micro_batch_size": m} for m in (1, 2, 4)}


def _check_c06(res: dict[str, dict], what: str) -> None:
    first = next(iter(res.values()))
    for name, r in res.items():
        assert r["metrics"]["actor/pg_loss"] == pytest.approx(2.5, abs=1e-6), f"{what} {name}: (1 + 3 * 3) / 4"
        assert r["metrics"]["actor/num_loss_tokens"] == 4.0
        for p, g in first["grads"].items():
            torch.testing.assert_close(r["grads"][p], g, atol=GRAD_TOL, rtol=0, msg=f"{what} {name}: {p}")


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_C06_token_mean(tiny_llama_path: str, layout: str) -> None:
    configs = _c06_configs(layout)
    one = _c06_run(tiny_llama_path, configs)
    _check_c06(one, f"{layout}, 1 rank")
    two = run_on_gloo_ranks(_c06_run, tiny_llama_path, configs)[0]
    _check_c06(two, f"{layout}, 2 ranks")
    ref = next(iter(one.values()))["grads"]
    for name, r in two.items():
        for p, g in ref.items():
            torch.testing.assert_close(r["grads"][p], g, atol=GRAD_TOL, rtol=0, msg=f"{layout} 1 vs 2 ranks {name}: {p}")
