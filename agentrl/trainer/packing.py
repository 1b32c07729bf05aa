"""How ``PolicyTrainer`` lays out and scores the rows of one micro-batch.

Two row layouts (``TrainerConfig.row_layout``):

- ``"packed"`` (default): the micro-batch's rows are concatenated into one sequence
  ``[1, Tm]`` with no padding. Attention is restricted to each row (block-diagonal causal)
  and position ids restart at 0 per row, so every row is scored exactly as if alone. The
  row boundaries travel to the attention kernel as ``cu_seq_lens_q/k`` (int32 ``[n + 1]``)
  and ``max_length_q/k`` keyword arguments, the names Hugging Face's variable-length flash
  attention reads (``transformers.modeling_flash_attention_utils._flash_attention_forward``).
  Kernels: ``flash_attention_2`` on CUDA (``flash_attn_varlen_func``); elsewhere
  ``VARLEN_SDPA`` (``agentrl.trainer.attention``, registered with transformers'
  ``AttentionInterface``), which runs
  ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`` once per row
  segment, so no FLOP is spent on padding or between rows and no dense ``[Tm, Tm]`` mask
  is built (its ``AttentionMaskInterface`` entry returns ``None`` for packed input). The
  ``sdpa`` and ``eager`` kernels also score packed rows, up to rounding (below):
  transformers detects the restarts of ``position_ids`` and builds a dense block-diagonal
  mask over the whole packed sequence.
- ``"padded"``: rows right-padded to the longest row of the micro-batch with an
  ``attention_mask``, kept for comparison and for kernels without variable-length
  support. ``VARLEN_SDPA`` (its mask entry hands the kernel the ``[B, L]`` padding mask,
  as transformers does for flash attention) runs each row's attention at the row's own
  length, so padded rows score exactly as packed ones. A kernel that attends over the
  padded width (``sdpa``, ``eager``) is exact only up to rounding: PyTorch's CPU
  flash-attention kernel (``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``) picks its
  query/key block sizes from the sequence length and each query block's causal end, so a
  row computed inside a longer sequence sums its attention in another order, with or
  without a mask (measured bounds: ``agentrl.trainer.config.ATTENTION_WIDTH_LOG_PROB_TOL``
  and ``ATTENTION_WIDTH_GRAD_TOL``).

Micro-batches: with ``"packed"``, rows are bin-packed (first-fit decreasing) into at most
``micro_batch_tokens`` tokens each (``pack_micro_batches``); with ``"padded"``, rows are
grouped in order by ``micro_batch_size`` (``_fsdp_common.micro_batches``).

The LM head only where a loss reads: ``install_scorer`` attaches a method to the (FSDP2)
model that runs the backbone, keeps the hidden states only at the requested positions
(the position *before* each scored token), and projects them to the vocabulary in chunks
of ``chunk_tokens`` rows; with gradients each chunk keeps only its ``[C, H]`` input and
``[C]`` logsumexp and recomputes its logits in backward (an autograd function with the
softmax gradient written out, so the logsumexp and the entropy are not recomputed as
under activation checkpointing). Autograd then keeps ``[n, H]`` hidden states instead of
``[Tm, V]`` logits, and the extra memory of the log-prob step is about
``chunk_tokens x V x 4`` bytes times a small constant (the logits, their softmax and
their gradient of one chunk), plus the head's weight gradient (``V x H x 4`` bytes, part
of any training step; held twice while a chunk's share is added). Measured for SmolLM2
(V = 49,152, H = 576: a 108 MB weight gradient) at the 2,817 loss positions of a default
job's iteration (``tests/benchmarks/bench_trainer.py``): 417 MB with chunks of 256, 559 MB
with 1,024, 1,720 MB for the whole ``[n, V]`` at once. The method is
registered with ``torch.distributed.fsdp.register_fsdp_forward_method``: calling the
backbone and ``lm_head`` outside the root module's ``forward`` would skip FSDP's
all-gather of the root's parameters (``embed_tokens``, the final norm and ``lm_head``).

Log-probs follow ``agentrl.trainer.losses.logprobs_from_logits``: ``log_softmax(logits /
temperature)`` at the label, in fp32 (design.md, invariant 4); entropies are those of the
same scaled distribution.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import torch
import torch.nn.functional as F

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer.config import ROW_LAYOUTS  # one source for the names

ScoredPositions = Literal["loss", "all"]
SCORED_POSITIONS: tuple[str, ...] = ("loss", "all")

DEFAULT_MICRO_BATCH_TOKENS = 8192
"""Token budget of a packed micro-batch when the config gives none."""

SCORER_METHOD = "agentrl_score"
"""Name of the scoring method ``install_scorer`` attaches to the model instance."""

_LOGIT_TRANSFORM_ATTRS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")
"""HF config attributes of models whose forward transforms ``lm_head``'s output (Gemma 2
soft-capping, Cohere / Granite scaling): those are scored from the model's own logits."""


# --------------------------------------------------------------------- micro-batches


def pack_micro_batches(rows: Sequence[int], row_lens: Sequence[int], budget: int) -> list[list[int]]:
    """Bin-pack ``rows`` into micro-batches of at most ``budget`` tokens (first-fit
    decreasing: longest row first, each into the first micro-batch with room).

    A row longer than ``budget`` runs alone. Deterministic: ties in length keep row
    order; micro-batches come in creation order, each listing its rows in ascending order.

    Args:
        rows: indices of this rank's rows.
        row_lens: ``row_lens[r]`` = tokens of row ``r`` (indexed by row id, all rows).
        budget: tokens per micro-batch, >= 1.

    Returns:
        Lists of row indices; every row of ``rows`` in exactly one.

    Raises:
        ConfigError: ``budget < 1``.
    """
    if not (isinstance(budget, int) and budget >= 1):
        raise ConfigError(f"micro_batch_tokens={budget!r}; expected an int >= 1")
    order = sorted(rows, key=lambda r: (-int(row_lens[r]), r))
    bins: list[list[int]] = []
    room: list[int] = []
    for r in order:
        n = int(row_lens[r])
        for i, free in enumerate(room):
            if n <= free:
                bins[i].append(r)
                room[i] -= n
                break
        else:
            bins.append([r])
            room.append(budget - n)
    return [sorted(b) for b in bins]


def padded_positions(groups: Sequence[Sequence[int]], row_lens: Sequence[int], layout: str) -> tuple[int, int]:
    """``(padding, scored)``: positions the model runs on that are padding, and all
    positions it runs on, over ``groups`` (0 padding when packed)."""
    pad = scored = 0
    for g in groups:
        if not g:
            continue
        lens = [int(row_lens[r]) for r in g]
        width = sum(lens) if layout == "packed" else len(lens) * max(lens)
        scored += width
        pad += width - sum(lens)
    return pad, scored


# --------------------------------------------------------------------- model inputs


@dataclass(frozen=True)
class ModelInputs:
    """The model inputs of one micro-batch in one layout, on the target device.

    Attributes:
        input_ids, position_ids: ``[1, Tm]`` (packed) or ``[B, L]`` (padded) int64.
        attention_mask: ``None`` (packed) or ``[B, L]`` int64, 0 on padding.
        attn_kwargs: ``cu_seq_lens_q/k`` (int32 ``[B + 1]``) and ``max_length_q/k`` for
            packed rows; empty when padded.
        flat_index: ``[Tm]`` int64, the flat model position (``b * L + t``) of each packed
            token of the micro-batch.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    attn_kwargs: dict[str, Any]
    flat_index: torch.Tensor


def model_inputs(
    input_ids: torch.Tensor, position_ids: torch.Tensor, seq_lens: Sequence[int], layout: str, device: torch.device
) -> ModelInputs:
    """Lay out a micro-batch's packed rows for the model.

    Args:
        input_ids, position_ids: ``[Tm]`` int64, the micro-batch's rows concatenated
            (``TokenBatch.select_rows(rows)``).
        seq_lens: the ``B`` row lengths, ``sum == Tm``.
        layout: ``"packed"`` or ``"padded"``.
        device: where the model computes.

    Raises:
        ConfigError: unknown ``layout``.
    """
    lens = [int(n) for n in seq_lens]
    total = sum(lens)
    if layout == "packed":
        cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)  # (B+1,)
        width = max(lens)
        return ModelInputs(
            input_ids=input_ids.reshape(1, total).to(device),  # (1, Tm)
            position_ids=position_ids.reshape(1, total).to(device),  # (1, Tm)
            attention_mask=None,
            attn_kwargs={"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": width, "max_length_k": width},
            flat_index=torch.arange(total, device=device),  # (Tm,)
        )
    if layout == "padded":
        from agentrl.trainer._fsdp_common import right_pad_rows

        slices, start = [], 0
        for n in lens:
            slices.append(slice(start, start + n))
            start += n
        ids, pos, attn = right_pad_rows(input_ids, position_ids, slices, range(len(lens)))  # (B, L) each
        width = ids.shape[1]
        flat = torch.cat([torch.arange(n) + b * width for b, n in enumerate(lens)])  # (Tm,)
        return ModelInputs(ids.to(device), pos.to(device), attn.to(device), {}, flat.to(device))
    raise ConfigError(f"row_layout={layout!r}; expected one of {ROW_LAYOUTS}")


def scored_targets(loss_mask: torch.Tensor, seq_lens: Sequence[int], positions: str) -> torch.Tensor:
    """Packed indices ``t`` of the tokens whose log-prob is computed (each predicted from
    the hidden state at ``t - 1``, inside its row).

    Args:
        loss_mask: ``[Tm]`` 0/1.
        seq_lens: the ``B`` row lengths.
        positions: ``"loss"``: tokens with ``loss_mask == 1`` (never a row's first token;
            ``TokenBatch.pack`` and the trainer check it); ``"all"``: every token except
            each row's first (nothing to condition on).

    Returns:
        ``[n]`` int64 on CPU, ascending.

    Raises:
        ConfigError: unknown ``positions``.
        ContractError: a loss token at a row's first position.
    """
    lens = torch.as_tensor([int(n) for n in seq_lens], dtype=torch.long)  # (B,)
    starts = torch.cumsum(lens, 0) - lens  # (B,)
    if positions == "loss":
        if bool((loss_mask[starts] > 0).any()):
            raise ContractError("loss_mask is 1 on a row's first token, which has no prefix to be scored from")
        return torch.nonzero(loss_mask > 0).flatten()  # (n,)
    if positions == "all":
        keep = torch.ones(int(lens.sum()), dtype=torch.bool)  # (Tm,)
        keep[starts] = False
        return torch.nonzero(keep).flatten()  # (n,)
    raise ConfigError(f"positions={positions!r}; expected one of {SCORED_POSITIONS}")


# --------------------------------------------------------------------- the scorer


def _head_chunk(
    head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden)  # (C, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature  # (C, V) fp32 (fp64 kept)
    lse = torch.logsumexp(logits, dim=-1)  # (C,)
    lp = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse  # (C,)
    if with_entropy:
        with torch.no_grad():
            logp = logits - lse.unsqueeze(-1)  # (C, V)
            ent = -(logp.exp() * logp).sum(dim=-1)  # (C,)
    else:
        ent = lp.new_zeros(0)
    return lp, ent


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)  # (C, V) compute dtype, a fresh tensor
    # in place: one [C, V] buffer (fp32; fp64 kept; a bf16 output is copied up once)
    return logits.to(torch.promote_types(logits.dtype, torch.float32)).div_(temperature)  # (C, V)


class _HeadLogProb(torch.autograd.Function):
    """``log_softmax(hidden @ W.T + b) / T)[label]`` of one chunk, with a hand-written
    backward that recomputes the chunk's logits once (like activation checkpointing) but
    not the logsumexp or the entropy: forward saves ``hidden``, ``labels`` and the
    ``[C]`` logsumexp; backward rebuilds ``p = softmax`` and uses
    ``d lp / d s = onehot(label) - p`` (``s`` = scaled logits)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, with_entropy):  # type: ignore[override]
        scaled = _scaled_logits(hidden, weight, bias, temperature)  # (C, V)
        lse = torch.logsumexp(scaled, dim=-1)  # (C,)
        lp = scaled.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse  # (C,)
        if with_entropy:
            p = (scaled - lse.unsqueeze(-1)).exp_()  # (C, V) softmax
            ent = lse - p.mul_(scaled).sum(dim=-1)  # (C,) -sum p log p, log p = s - lse
            del p
        else:
            ent = lp.new_zeros(0)
        ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.temperature = temperature
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):  # type: ignore[override]
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        # one [C, V] buffer, reused in place: scaled logits -> softmax -> d loss / d logits
        grad = _scaled_logits(hidden, weight, bias, ctx.temperature)  # (C, V) scaled logits
        grad.sub_(lse.unsqueeze(-1)).exp_().mul_(-g_lp.unsqueeze(-1))  # (C, V): -g * p
        grad.scatter_add_(-1, labels.unsqueeze(-1), g_lp.unsqueeze(-1))  # + g at the label
        grad = grad.div_(ctx.temperature).to(hidden.dtype)  # (C, V) d loss / d logits
        g_hidden = grad @ weight if ctx.needs_input_grad[0] else None  # (C, H)
        g_weight = grad.t() @ hidden if ctx.needs_input_grad[1] else None  # (V, H)
        g_bias = grad.sum(0) if bias is not None and ctx.needs_input_grad[2] else None  # (V,)
        return g_hidden, g_weight, g_bias, None, None, None


def chunked_head_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    *,
    chunk_tokens: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of ``labels`` under ``softmax(head(hidden) / temperature)``,
    ``chunk_tokens`` rows at a time, so no ``[n, V]`` tensor outlives its chunk: with
    gradients, each chunk keeps only its ``[C, H]`` input and ``[C]`` logsumexp, and its
    backward recomputes the chunk's logits (``_HeadLogProb``).

    Args:
        head: the LM head, a ``torch.nn.Linear`` (``[V, H]`` weight, optional bias).
        hidden: ``[n, H]`` hidden states at the positions before the scored tokens.
        labels: ``[n]`` int64 token ids in ``[0, V)``.
        temperature: > 0.
        chunk_tokens: >= 1.
        with_entropy: also return entropies (no gradient).

    Returns:
        ``(log_probs [n] float32, entropies [n] float32 or None)`` (float64 for float64
        inputs).
    """
    weight, bias = head.weight, head.bias
    lps, ents = [], []
    for a in range(0, hidden.shape[0], chunk_tokens):
        b = min(a + chunk_tokens, hidden.shape[0])
        lp, ent = _HeadLogProb.apply(hidden[a:b], weight, bias, labels[a:b], temperature, with_entropy)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        empty = hidden.new_zeros(0, dtype=torch.promote_types(hidden.dtype, torch.float32))
        return empty, (empty if with_entropy else None)
    lp = torch.cat(lps)  # (n,)
    return lp, (torch.cat(ents).detach() if with_entropy else None)


def head_is_plain(model: torch.nn.Module) -> bool:
    """Whether ``model``'s logits are ``lm_head(hidden)`` with nothing after (a linear head
    and none of the logit transforms of ``_LOGIT_TRANSFORM_ATTRS`` in its config)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        return False
    cfg = getattr(model, "config", None)
    return not any(getattr(cfg, a, None) not in (None, 1, 1.0) for a in _LOGIT_TRANSFORM_ATTRS)


def _score_method(
    self: torch.nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    select: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool,
    attn_kwargs: dict[str, Any],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Backbone → hidden states at ``select`` → chunked head. Bound to the model by
    ``install_scorer`` and wrapped by FSDP as a forward method."""
    backbone = getattr(self, self.base_model_prefix)
    out = backbone(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **attn_kwargs
    )
    hidden = out.last_hidden_state  # (B, L, H)
    picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, select)  # (n, H)
    return chunked_head_logprobs(
        self.get_output_embeddings(), picked, labels, temperature, chunk_tokens=chunk_tokens, with_entropy=with_entropy
    )


def install_scorer(model: torch.nn.Module) -> None:
    """Attach ``SCORER_METHOD`` to ``model`` (an HF causal LM) and register it as an FSDP
    forward method, so the root's parameters are all-gathered around it like around
    ``forward``. Call after ``fully_shard`` (a no-op registration on an unsharded model).
    Models whose logits are not a plain ``lm_head(hidden)`` (``head_is_plain``) get no
    method; ``score_tokens`` then scores them from the model's own logits."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    if not head_is_plain(model) or getattr(model, "base_model_prefix", None) is None:
        return
    setattr(model, SCORER_METHOD, _score_method.__get__(model, type(model)))
    register_fsdp_forward_method(model, SCORER_METHOD)


def score_tokens(
    model: torch.nn.Module,
    inputs: ModelInputs,
    targets: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    *,
    chunk_tokens: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the tokens at packed indices ``targets``.

    Args:
        model: the causal LM (FSDP2-wrapped, with ``install_scorer`` applied).
        inputs: the micro-batch in its layout (``model_inputs``).
        targets: ``[n]`` int64 packed indices, none a row's first token (``scored_targets``).
        labels: ``[n]`` int64, the token ids at ``targets``.
        temperature: logits are divided by it.
        chunk_tokens: rows of logits at once.
        with_entropy: also return entropies of the distributions predicting each target.

    Returns:
        ``(log_probs [n] float32, entropies [n] float32 or None)`` on the model's device,
        differentiable when grad is enabled.
    """
    dev = inputs.input_ids.device
    if targets.numel() == 0:
        # Nothing to score: score the first position anyway and keep it in the graph with
        # weight 0, so backbone and head still take part in forward and backward (FSDP
        # reduce-scatters the same parameters on every rank; backward() has a graph).
        lp, ent = score_tokens(
            model, inputs, torch.ones(1, dtype=torch.long), inputs.input_ids.reshape(-1)[:1], temperature,
            chunk_tokens=chunk_tokens, with_entropy=with_entropy,
        )  # (1,)
        return lp[:0] + 0.0 * lp.sum(), (None if ent is None else ent[:0])  # (0,)
    select = inputs.flat_index.index_select(0, targets.to(dev) - 1)  # (n,)
    labels = labels.to(dev)
    scorer = getattr(model, SCORER_METHOD, None)
    if scorer is not None:
        return scorer(
            inputs.input_ids,
            inputs.position_ids,
            inputs.attention_mask,
            select,
            labels,
            temperature,
            chunk_tokens,
            with_entropy,
            inputs.attn_kwargs,
        )
    # A model with a logit transform after its head: its own (full) logits, then select.
    logits = model(
        input_ids=inputs.input_ids,
        attention_mask=inputs.attention_mask,
        position_ids=inputs.position_ids,
        use_cache=False,
        **inputs.attn_kwargs,
    ).logits  # (B, L, V)
    picked = logits.reshape(-1, logits.shape[-1]).index_select(0, select)  # (n, V)
    lps, ents = [], []
    for a in range(0, picked.shape[0], chunk_tokens):
        lp, ent = _head_chunk(torch.nn.Identity(), picked[a : a + chunk_tokens], labels[a : a + chunk_tokens], temperature, with_entropy)
        lps.append(lp)
        ents.append(ent)
    lp = torch.cat(lps) if lps else picked.new_zeros(0, dtype=torch.float32)
    return lp, ((torch.cat(ents).detach() if ents else lp.new_zeros(0)) if with_entropy else None)


def dummy_score(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The forward of a dummy pass (``TrainerCore.dummy_forward``): one token through the
    same path as a real micro-batch (backbone and head), ``[1]`` log-prob."""
    dev = ids.device
    inputs = ModelInputs(
        input_ids=ids.reshape(1, -1),
        position_ids=torch.zeros_like(ids).reshape(1, -1),
        attention_mask=None,
        attn_kwargs={},
        flat_index=torch.arange(ids.numel(), device=dev),
    )
    lp, _ = score_tokens(
        model, inputs, torch.ones(1, dtype=torch.long), ids.reshape(-1)[:1], 1.0, chunk_tokens=1, with_entropy=False
    )
    return lp  # (1,)


# --------------------------------------------------------------------- peak memory


class PeakMemory:
    """Peak memory of a stretch of work, in MB: CUDA's max allocated bytes on a CUDA
    device, else the growth of the process's peak resident set (Linux ``VmHWM``, reset
    at ``start`` through ``/proc/self/clear_refs``; where that cannot be reset, the growth
    of ``ru_maxrss``, which misses peaks below an earlier one)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._base = 0
        self._hwm_reset = False

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._hwm_reset = True
        except OSError:
            self._hwm_reset = False
        self._base = _rss_kb() if self._hwm_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        peak = _status_kb("VmHWM") if self._hwm_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return max(0, peak - self._base) / 1024.0


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _rss_kb() -> int:
    return _status_kb("VmRSS")
