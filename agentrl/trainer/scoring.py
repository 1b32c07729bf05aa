"""Scoring a micro-batch's tokens with the LM head only where a loss reads.

``install_scorer`` attaches a method to the (FSDP2) model that runs the backbone, keeps
the hidden states only at the requested positions (the position *before* each scored
token), and projects them to the vocabulary in chunks of ``chunk_tokens`` rows; with
gradients each chunk keeps only its ``[C, H]`` input and ``[C]`` logsumexp and recomputes
its logits in backward (an autograd function with the softmax gradient written out, so
the logsumexp and the entropy are not recomputed as under activation checkpointing).
Autograd then keeps ``[n, H]`` hidden states instead of ``[Tm, V]`` logits, and the extra
memory of the log-prob step is about ``chunk_tokens x V x 4`` bytes times a small
constant (the logits, their softmax and their gradient of one chunk), plus the head's
weight gradient (``V x H x 4`` bytes, part of any training step; held twice while a
chunk's share is added). Measured for SmolLM2 (V = 49,152, H = 576: a 108 MB weight
gradient) at the 2,817 loss positions of a default job's iteration
(``tests/benchmarks/bench_trainer.py``): 417 MB with chunks of 256, 559 MB with 1,024,
1,720 MB for the whole ``[n, V]`` at once. The method is registered with
``torch.distributed.fsdp.register_fsdp_forward_method``: calling the backbone and
``lm_head`` outside the root module's ``forward`` would skip FSDP's all-gather of the
root's parameters (``embed_tokens``, the final norm and ``lm_head``).

Log-probs follow ``agentrl.trainer.losses.logprobs_from_logits``: ``log_softmax(logits /
temperature)`` at the label, in fp32 (docs/design.md, invariant 4); entropies are those of
the same scaled distribution. The micro-batch's model inputs come from
``agentrl.trainer.packing.model_inputs``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import register_fsdp_forward_method

from agentrl.trainer.packing import ModelInputs, model_inputs, scored_targets
from agentrl.types import TokenBatch

SCORER_METHOD = "agentrl_score"
"""Name of the scoring method ``install_scorer`` attaches to the model instance."""

_LOGIT_TRANSFORM_ATTRS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")
"""HF config attributes of models whose forward transforms ``lm_head``'s output (Gemma 2
soft-capping, Cohere / Granite scaling): those are scored from the model's own logits."""


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


def score_rows(
    model: torch.nn.Module,
    batch: TokenBatch,
    rows: Sequence[int],
    temperature: float,
    *,
    layout: str,
    device: torch.device,
    chunk_tokens: int,
    with_grad: bool,
    with_entropy: bool,
    positions: str = "loss",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Score ``rows`` of ``batch`` (one micro-batch) in ``layout`` (``"packed"`` or
    ``"padded"``, ``packing.model_inputs``) with ``model``; the LM head runs only at the
    positions before the scored tokens (``score_tokens``).

    Args:
        positions: ``"loss"``: only tokens with ``loss_mask == 1`` are scored; ``"all"``:
            every token except each row's first (``packing.scored_targets``).

    Returns:
        ``(log_probs [Tm], entropies [Tm] or None)`` float32 on ``device``, in row order
        (matching ``batch.select_rows(rows)``): the log-prob of each scored token and the
        entropy of the distribution that predicted it; 0 at tokens not scored (row
        starts, and with ``"loss"`` every token with ``loss_mask == 0``).
    """
    sub = batch.select_rows(rows)
    lens = sub.seq_lens.tolist()
    inputs = model_inputs(sub.input_ids, sub.position_ids, lens, layout, device)
    targets = scored_targets(sub.loss_mask, lens, positions)  # (n,)
    with torch.set_grad_enabled(with_grad):
        lp_sel, ent_sel = score_tokens(
            model,
            inputs,
            targets,
            sub.input_ids[targets],
            temperature,
            chunk_tokens=chunk_tokens,
            with_entropy=with_entropy,
        )  # (n,) each
        idx = targets.to(device)
        lp = torch.zeros(sub.num_tokens, dtype=torch.float32, device=device).index_put((idx,), lp_sel)  # (Tm,)
    ent = None
    if ent_sel is not None:
        ent = torch.zeros(sub.num_tokens, dtype=torch.float32, device=device).index_put((idx,), ent_sel)  # (Tm,)
    return lp, ent
