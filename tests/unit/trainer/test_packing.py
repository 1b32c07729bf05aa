"""Unit tests of agentrl.trainer's micro_batches, packing, attention, scoring and memory:
micro-batch bin-packing, the packed / padded model inputs, the scored positions, the per-row attention kernel, the chunked LM head and
the peak-memory meter. No model and no process group: plain tensors and small modules."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer import attention, micro_batches, packing, scoring

# ---------------------------------------------------------------- micro-batches


def test_first_fit_decreasing_fills_bins_longest_first() -> None:
    lens = [5, 9, 3, 7, 2, 4]  # rows 0..5
    groups = micro_batches.pack_micro_batches(range(6), lens, 12)
    # 9 -> bin0 (3 left); 7 -> bin1 (5 left); 5 -> bin1 (0 left); 4 -> bin2; 3 -> bin0; 2 -> bin2
    assert groups == [[1, 2], [0, 3], [4, 5]]
    for g in groups:
        assert sum(lens[r] for r in g) <= 12


def test_bin_packing_keeps_every_row_once_and_a_long_row_alone() -> None:
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(1, 50, (40,), generator=g).tolist()
    rows = list(range(0, 40, 2))  # one rank's rows
    groups = micro_batches.pack_micro_batches(rows, lens, 60)
    assert sorted(r for grp in groups for r in grp) == rows
    assert all(sum(lens[r] for r in grp) <= 60 for grp in groups)
    # a row longer than the budget runs alone
    assert micro_batches.pack_micro_batches([0, 1, 2], [100, 3, 4], 10) == [[0], [1, 2]]
    # budget 1: every row alone, in decreasing length
    assert micro_batches.pack_micro_batches([0, 1, 2], [2, 5, 3], 1) == [[1], [2], [0]]


def test_bin_packing_uses_fewer_passes_than_fixed_row_counts_on_the_default_lengths() -> None:
    # 16 rows with the default job's range and total (563..1036 tokens, 10,915 in all)
    lens = [563, 600, 610, 620, 630, 640, 650, 660, 670, 680, 690, 700, 710, 720, 736, 1036]
    assert sum(lens) == 10915
    groups = micro_batches.pack_micro_batches(range(16), lens, 8192)
    assert len(groups) == 2  # vs 4 padded micro-batches of 4 rows
    pad, scored = micro_batches.padded_positions(groups, lens, "packed")
    assert pad == 0 and scored == sum(lens)
    padded = micro_batches.micro_batches(range(16), lens, 4, None)
    pad, scored = micro_batches.padded_positions(padded, lens, "padded")
    assert scored == sum(4 * max(lens[r] for r in g) for g in padded) and pad == scored - sum(lens)


def test_bad_budget_or_layout_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="micro_batch_tokens=0"):
        micro_batches.pack_micro_batches([0], [3], 0)
    with pytest.raises(ConfigError, match="row_layout='ragged'"):
        micro_batches.layout_micro_batches([0], [3], layout="ragged", micro_batch_size=1, micro_batch_tokens=None)
    with pytest.raises(ConfigError, match="row_layout='ragged'"):
        packing.model_inputs(torch.zeros(3, dtype=torch.long), torch.arange(3), [3], "ragged", torch.device("cpu"))


def test_layout_micro_batches_picks_the_grouping_of_each_layout() -> None:
    lens = [4, 4, 4, 4]
    packed = micro_batches.layout_micro_batches(range(4), lens, layout="packed", micro_batch_size=1, micro_batch_tokens=8)
    assert packed == [[0, 1], [2, 3]]  # token budget, row count ignored
    padded = micro_batches.layout_micro_batches(range(4), lens, layout="padded", micro_batch_size=3, micro_batch_tokens=None)
    assert padded == [[0, 1, 2], [3]]
    default = micro_batches.layout_micro_batches(range(4), lens, layout="packed", micro_batch_size=1, micro_batch_tokens=None)
    assert default == [[0, 1, 2, 3]]  # DEFAULT_MICRO_BATCH_TOKENS


# ---------------------------------------------------------------- model inputs and targets


def test_packed_inputs_are_one_sequence_with_row_boundaries() -> None:
    ids = torch.arange(10, 19)  # rows of 2, 4, 3
    pos = torch.tensor([0, 1, 0, 1, 2, 3, 0, 1, 2])
    inp = packing.model_inputs(ids, pos, [2, 4, 3], "packed", torch.device("cpu"))
    assert inp.input_ids.shape == (1, 9) and torch.equal(inp.input_ids[0], ids)
    assert torch.equal(inp.position_ids[0], pos)
    assert inp.attention_mask is None
    assert inp.attn_kwargs["cu_seq_lens_q"].tolist() == [0, 2, 6, 9]
    assert inp.attn_kwargs["cu_seq_lens_q"].dtype == torch.int32
    assert inp.attn_kwargs["max_length_q"] == 4
    assert torch.equal(inp.flat_index, torch.arange(9))


def test_padded_inputs_map_each_token_to_its_padded_position() -> None:
    ids = torch.arange(10, 19)
    pos = torch.tensor([0, 1, 0, 1, 2, 3, 0, 1, 2])
    inp = packing.model_inputs(ids, pos, [2, 4, 3], "padded", torch.device("cpu"))
    assert inp.input_ids.shape == (3, 4)
    assert inp.attention_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
    assert inp.flat_index.tolist() == [0, 1, 4, 5, 6, 7, 8, 9, 10]
    assert torch.equal(inp.input_ids.reshape(-1)[inp.flat_index], ids)
    assert inp.attn_kwargs == {}


def test_scored_targets_loss_and_all() -> None:
    mask = torch.tensor([0, 1, 0, 0, 1, 1, 0, 1, 0.0])
    lens = [2, 4, 3]
    assert packing.scored_targets(mask, lens, "loss").tolist() == [1, 4, 5, 7]
    assert packing.scored_targets(mask, lens, "all").tolist() == [1, 3, 4, 5, 7, 8]
    with pytest.raises(ContractError, match="first token"):
        packing.scored_targets(torch.tensor([0, 1, 1, 0.0]), [2, 2], "loss")
    with pytest.raises(ConfigError, match="positions='some'"):
        packing.scored_targets(mask, lens, "some")


# ---------------------------------------------------------------- attention kernel


def _block_causal_reference(q, k, v, bounds):
    """Dense SDPA with a block-diagonal causal mask over the whole packed sequence."""
    t = q.shape[2]
    seg = torch.zeros(t, dtype=torch.long)
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        seg[s:e] = i
    allowed = (seg[:, None] == seg[None, :]) & torch.ones(t, t, dtype=torch.bool).tril()
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=allowed)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_varlen_sdpa_equals_a_dense_block_diagonal_mask_in_values_and_gradients(heads: int, kv_heads: int) -> None:
    g = torch.Generator().manual_seed(0)
    bounds = [0, 5, 6, 13, 21]
    q = torch.randn(1, heads, 21, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, kv_heads, 21, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, kv_heads, 21, 8, generator=g, dtype=torch.float64, requires_grad=True)
    cu = torch.tensor(bounds, dtype=torch.int32)
    out, _ = attention.varlen_sdpa_attention(torch.nn.Module(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    assert out.shape == (1, 21, heads, 8)  # transformers' layout
    ref = _block_causal_reference(q, k, v, bounds).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    w = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out * w).sum(), (q, k, v))
    want = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    # the boundaries can come from position ids instead (restarts at 0)
    pos = torch.cat([torch.arange(e - s) for s, e in zip(bounds[:-1], bounds[1:])])[None]
    out2, _ = attention.varlen_sdpa_attention(torch.nn.Module(), q, k, v, None, position_ids=pos)
    torch.testing.assert_close(out2, out, atol=0, rtol=0)
    # and a row really does not see the row before it
    cross, _ = attention.varlen_sdpa_attention(torch.nn.Module(), q, k, v, None)
    assert (cross[:, 5:] - out[:, 5:]).abs().max() > 1e-3


def test_varlen_sdpa_rejects_batched_boundaries() -> None:
    q = torch.zeros(2, 2, 4, 8)
    cu = torch.tensor([0, 2, 4], dtype=torch.int32)
    with pytest.raises(ContractError, match="batch of 1"):
        attention.varlen_sdpa_attention(torch.nn.Module(), q, q, q, None, cu_seq_lens_q=cu)
    with pytest.raises(ContractError, match="cu_seq_lens_q != cu_seq_lens_k"):
        attention.varlen_sdpa_attention(torch.nn.Module(), q[:1], q[:1], q[:1], None, cu_seq_lens_q=cu,
                                      cu_seq_lens_k=torch.tensor([0, 1, 4], dtype=torch.int32))


def test_varlen_sdpa_runs_padded_rows_at_their_own_length_bit_for_bit() -> None:
    """A ``[B, L]`` padding mask (what the kernel's mask entry returns for padded rows):
    each row's valid positions equal that row attended alone, bit for bit in fp32 at
    lengths where PyTorch's CPU kernel blocks a row's sums differently inside a wider
    call; padding positions are 0; a left-padded or holed row attends causally among its
    kept positions; gradients reach only them."""
    g = torch.Generator().manual_seed(1)
    lens, width, heads, kv_heads = [563, 1037, 300], 1037, 6, 2
    q = torch.randn(3, heads, width, 16, generator=g, requires_grad=True)
    k = torch.randn(3, kv_heads, width, 16, generator=g, requires_grad=True)
    v = torch.randn(3, kv_heads, width, 16, generator=g, requires_grad=True)
    keep = torch.zeros(3, width, dtype=torch.bool)
    keep[0, :563] = True
    keep[1] = True
    keep[2, 737:] = True  # left padding
    keep[2, 800:810] = False  # and a hole
    out, _ = attention.varlen_sdpa_attention(torch.nn.Module(), q, k, v, keep)
    assert out.shape == (3, width, heads, 16)  # transformers' layout
    for b, n in ((0, 563), (1, 1037)):
        alone = F.scaled_dot_product_attention(q[b:b + 1, :, :n], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                               is_causal=True, enable_gqa=True).transpose(1, 2)
        assert torch.equal(out[b:b + 1, :n], alone)
        assert torch.equal(out[b, n:], torch.zeros_like(out[b, n:]))
    idx = keep[2].nonzero().flatten()
    compact = F.scaled_dot_product_attention(*(t[2:3].index_select(2, idx) for t in (q, k, v)),
                                             is_causal=True, enable_gqa=True).transpose(1, 2)
    assert torch.equal(out[2:3].index_select(1, idx), compact)
    assert torch.equal(out[2, ~keep[2]], torch.zeros_like(out[2, ~keep[2]]))
    out.sum().backward()
    for t in (q, k, v):
        assert torch.equal(t.grad[0, :, 563:], torch.zeros_like(t.grad[0, :, 563:]))


def test_varlen_mask_entry_hands_padded_rows_their_padding_mask() -> None:
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    pad = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    kw = dict(batch_size=2, q_length=4, kv_length=4, q_offset=0, kv_offset=0, mask_function=causal_mask_function)
    got = attention._varlen_sdpa_mask(attention_mask=pad, **kw)
    assert got.dtype == torch.bool and torch.equal(got, pad.bool())
    assert attention._varlen_sdpa_mask(attention_mask=torch.ones(2, 4, dtype=torch.long), **kw) is None  # no padding
    assert attention._varlen_sdpa_mask(attention_mask=None, **kw) is None  # packed rows
    # anything but plain causal self-attention without a cache keeps transformers' 4-D mask
    sliding = {**kw, "mask_function": sliding_window_causal_mask_function(2)}
    assert attention._varlen_sdpa_mask(attention_mask=pad.bool(), **sliding).dim() == 4
    assert attention._varlen_sdpa_mask(attention_mask=pad.bool(), **{**kw, "q_length": 1, "q_offset": 3}).dim() == 4


def test_auto_resolves_to_the_per_row_kernel_on_cpu() -> None:
    from transformers import AttentionInterface

    assert attention.resolve_attn_implementation("auto", device="cpu", dtype="float32") == attention.VARLEN_SDPA
    assert attention.VARLEN_SDPA in AttentionInterface._global_mapping
    # fp32 on CUDA has no flash kernel: the per-row SDPA kernel, whether or not flash_attn is installed
    assert attention.resolve_attn_implementation("auto", device="cuda", dtype="float32") == attention.VARLEN_SDPA
    assert attention.resolve_attn_implementation("sdpa", device="cpu", dtype="float32") == "sdpa"


# ---------------------------------------------------------------- chunked LM head


def _head(weight: torch.Tensor) -> torch.nn.Linear:
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        head.weight.copy_(weight)
    return head


def test_C04_chunked_head_log_prob_and_entropy_at_temperature_half() -> None:
    head = _head(torch.tensor([[2.0], [1.0], [0.0], [-1.0]]))  # logits = [2, 1, 0, -1] for hidden [1]
    lp, ent = scoring.chunked_head_logprobs(
        head, torch.ones(1, 1), torch.tensor([0]), 0.5, chunk_tokens=1, with_entropy=True
    )
    assert lp.dtype == torch.float32 and lp.shape == (1,)
    assert lp.item() == pytest.approx(-0.14508, abs=1e-5)
    assert ent.item() == pytest.approx(0.45543, abs=1e-5)  # entropy of softmax([4, 2, 0, -2])


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_chunked_head_equals_full_log_softmax_in_values_and_gradients(chunk: int) -> None:
    # float64, so the comparison checks the math (chunking, checkpointing, temperature),
    # not the rounding of two fp32 formulas
    g = torch.Generator().manual_seed(1)
    head = _head(torch.randn(50, 16, generator=g, dtype=torch.float64)).double()
    hidden = torch.randn(13, 16, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (13,), generator=g)
    w = torch.randn(13, generator=g, dtype=torch.float64)
    t = 0.7
    lp, ent = scoring.chunked_head_logprobs(head, hidden, labels, t, chunk_tokens=chunk, with_entropy=True)
    (lp * w).sum().backward()
    got_h, got_w = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad = None
    head.weight.grad = None
    logp = torch.log_softmax(head(hidden) / t, dim=-1)  # (13, 50)
    ref = logp.gather(-1, labels[:, None]).squeeze(-1)
    (ref * w).sum().backward()
    torch.testing.assert_close(lp, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1).detach(), atol=1e-12, rtol=0)
    torch.testing.assert_close(got_h, hidden.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(got_w, head.weight.grad, atol=1e-12, rtol=0)
    assert not ent.requires_grad
    # fp32 in, fp32 out
    lp32, _ = scoring.chunked_head_logprobs(head.float(), hidden.detach().float(), labels, t, chunk_tokens=chunk,
                                            with_entropy=False)
    assert lp32.dtype == torch.float32
    torch.testing.assert_close(lp32.double(), ref.detach(), atol=1e-4, rtol=1e-6)


def test_chunked_head_gradient_reaches_a_bias_and_ignores_the_entropy() -> None:
    g = torch.Generator().manual_seed(2)
    head = torch.nn.Linear(8, 30, bias=True).double()
    hidden = torch.randn(9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 30, (9,), generator=g)
    lp, ent = scoring.chunked_head_logprobs(head, hidden, labels, 1.3, chunk_tokens=4, with_entropy=True)
    (lp.sum() + 0.0 * ent.sum()).backward()
    got = (hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone())
    for t in (hidden, head.weight, head.bias):
        t.grad = None
    ref = torch.log_softmax(head(hidden) / 1.3, dim=-1).gather(-1, labels[:, None]).sum()
    ref.backward()
    for a, b in zip(got, (hidden.grad, head.weight.grad, head.bias.grad)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_chunked_head_of_no_positions_is_empty() -> None:
    head = _head(torch.randn(5, 3))
    lp, ent = scoring.chunked_head_logprobs(head, torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), 1.0,
                                            chunk_tokens=4, with_entropy=True)
    assert lp.shape == (0,) and ent.shape == (0,)


def test_head_is_plain_only_for_a_linear_head_without_logit_transforms() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=4)
    model = LlamaForCausalLM(cfg)
    assert scoring.head_is_plain(model)
    model.config.final_logit_softcapping = 30.0
    assert not scoring.head_is_plain(model)


# ---------------------------------------------------------------- peak memory


def test_peak_memory_measures_the_growth_of_a_stretch_of_work() -> None:
    # In a fresh process: in a long test process the allocator (tcmalloc under vLLM's
    # preload, or glibc's arenas) may hand back pages an earlier test left resident, so a
    # 64 MiB tensor need not grow the resident set at all (fresh-clone CI read 0.0).
    code = (
        "import torch\n"
        "from agentrl.trainer import memory\n"
        "meter = memory.PeakMemory(torch.device('cpu'))\n"
        "meter.start()\n"
        "x = torch.ones(64 * 2**20 // 4)\n"
        "x += 1\n"
        "del x\n"
        "first = meter.peak_mb()\n"
        "meter.start()\n"
        "print(first, meter.peak_mb(), meter._hwm_reset)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    first, second, hwm_reset = out.stdout.split()
    assert 48.0 < float(first) < 1024.0, out.stdout
    if hwm_reset == "True":  # a new stretch does not inherit the old peak
        assert float(second) < 48.0, out.stdout
