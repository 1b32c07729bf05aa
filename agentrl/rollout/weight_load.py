"""Loading new weights into a running vLLM model on CPU, in place and without vLLM's
generic reload machinery.

Why: vLLM's ``reload_weights`` (``vllm.model_executor.model_loader.reload``) puts every
layer back on the meta device, materialises it in fresh memory, runs the checkpoint
loaders (which copy q/k/v and gate/up into the fused ``qkv_proj`` / ``gate_up_proj``),
repacks each linear layer for oneDNN and copies the result back. For SmolLM2-135M in fp32
that took 1.2-2.3 s here (2 busy cores), of which about 1.3 s were copies into freshly
allocated (page-faulting) memory and 0.3-0.9 s the oneDNN repacking. ``load_in_place``
does only what must be done: it repacks each linear layer straight from the received
tensors (the fused q/k/v and gate/up weights are zero-copy views when the sender laid
them out next to each other, as ``agentrl.cluster.engines.weight_sync`` does) and copies the few
plain parameters (norms, embedding) into the memory they already occupy.

It applies to vLLM's CPU platform, tensor-parallel size 1, unquantized models whose
checkpoint names map onto vLLM's modules through ``packed_modules_mapping`` alone
(Llama, Qwen2/3, Mistral and most decoder-only models). Anything else is reported back
(``load_in_place`` returns the reason, having changed nothing) and the caller uses
``reload_weights``. Tests: ``tests/integration/cluster/test_weight_sync.py`` (engine
log-probs equal the trainer's after a sync, 1e-4, fp32).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch


@dataclass
class _Plan:
    """What ``load_in_place`` will do, built and checked before anything changes."""

    linears: list[tuple[Any, list[torch.Tensor], list[torch.Tensor] | None]] = field(default_factory=list)
    copies: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (vLLM param, source)
    repack: list[Any] = field(default_factory=list)  # embedding-like modules whose GEMM handler is rebuilt


def _fused(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts, 0)``, as a view when the parts lie back to back in one storage."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    cols = first.shape[1:]
    adjacent = all(p.is_contiguous() and p.dtype == first.dtype and p.shape[1:] == cols
                   and p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() for p in parts)
    if adjacent:
        step = first[0].numel() if first.dim() > 1 else 1
        offset = first.storage_offset()
        for p in parts:
            if p.storage_offset() != offset:
                adjacent = False
                break
            offset += p.shape[0] * step
    if not adjacent:
        return torch.cat(parts, 0)
    rows = sum(p.shape[0] for p in parts)
    return torch.as_strided(first, (rows, *cols), first.stride())


def _plan(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> _Plan | str:
    from vllm.distributed import get_tensor_model_parallel_world_size
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "not vLLM's CPU platform"
    if get_tensor_model_parallel_world_size() != 1:
        return "tensor parallelism > 1"
    if current_platform.is_zen_cpu():
        return "zentorch GEMMs may keep a reference to the loaded weight"
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is not None and any(getattr(mapper, f, None) for f in (
            "orig_to_new_renaming", "orig_to_new_regex", "orig_to_new_substr", "orig_to_new_prefix", "orig_to_new_suffix")):
        return f"{type(model).__name__} renames checkpoint weights (hf_to_vllm_mapper)"
    packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", None) or {})

    plan = _Plan()
    used: set[str] = set()
    owned: set[int] = set()  # ids of the vLLM parameters the module rules below take care of
    embedding_params: dict[int, torch.Tensor] = {}

    for mod_name, module in model.named_modules():
        qm = getattr(module, "quant_method", None)
        if qm is None:
            continue
        prefix = f"{mod_name}." if mod_name else ""
        if isinstance(qm, UnquantizedLinearMethod):
            if not hasattr(module, "cpu_linear") or getattr(module, "_cpu_skip_gemm_dispatch", False):
                return f"{mod_name}: no CPU GEMM handler to rebuild"
            parent, _, leaf = mod_name.rpartition(".")
            base = f"{parent}." if parent else ""
            names = [f"{base}{s}" for s in packed.get(leaf, [leaf])]
            ws = [weights.get(f"{n}.weight") for n in names]
            if any(w is None for w in ws):
                return f"{mod_name}: weights {[f'{n}.weight' for n, w in zip(names, ws) if w is None]} not sent"
            sizes = list(getattr(module, "output_sizes", None) or [module.output_size_per_partition])
            if len(sizes) != len(ws) or any(w.dim() != 2 or w.shape[0] != s or w.shape[1] != module.input_size_per_partition
                                            for w, s in zip(ws, sizes)):
                return (f"{mod_name}: sent shapes {[tuple(w.shape) for w in ws]} do not fit output sizes {sizes} x "
                        f"{module.input_size_per_partition}")
            if module.weight.numel() not in (0, sum(sizes) * module.input_size_per_partition):
                return f"{mod_name}: weight of unexpected shape {tuple(module.weight.shape)}"
            bias = getattr(module, "bias", None)
            bs = None
            if bias is not None:
                bs = [weights.get(f"{n}.bias") for n in names]
                if any(b is None for b in bs):
                    return f"{mod_name}: bias not sent"
                used.update(f"{n}.bias" for n in names)
                owned.add(id(bias))
            elif any(f"{n}.bias" in weights for n in names):
                return f"{mod_name}: a bias was sent but the engine's layer has none"
            used.update(f"{n}.weight" for n in names)
            owned.add(id(module.weight))
            plan.linears.append((module, ws, bs))
        elif isinstance(qm, UnquantizedEmbeddingMethod):
            param = module.weight
            if hasattr(module, "cpu_linear"):
                plan.repack.append(module)
            owned.add(id(param))
            if id(param) in embedding_params:
                used.add(f"{prefix}weight")  # tied (lm_head == embed_tokens): loaded once, a sent copy is ignored
                continue
            src = weights.get(f"{prefix}weight")
            if src is None:
                return f"{prefix}weight not sent"
            org = int(getattr(module, "org_vocab_size", param.shape[0]))
            if getattr(module, "num_added_embeddings", 0) or src.shape != (org, param.shape[1]) or org > param.shape[0]:
                return f"{prefix}weight: sent {tuple(src.shape)}, engine has {tuple(param.shape)} (vocabulary {org})"
            used.add(f"{prefix}weight")
            embedding_params[id(param)] = param
            plan.copies.append((param[:org], src))
        elif qm.__class__.__module__.startswith("vllm.model_executor.layers.quantization"):
            return f"{mod_name}: quantized layer ({type(qm).__name__})"

    for name, param in model.named_parameters():
        if id(param) in owned:
            continue
        owner = model.get_submodule(name.rpartition(".")[0])
        if getattr(owner, "quant_method", None) is not None or hasattr(owner, "cpu_linear"):
            return f"{name}: parameter of a {type(owner).__name__} this loader does not handle"
        src = weights.get(name)
        if src is None:
            return f"{name} not sent"
        if src.shape != param.shape:
            return f"{name}: sent {tuple(src.shape)}, engine has {tuple(param.shape)}"
        used.add(name)
        plan.copies.append((param, src))
    extra = sorted(set(weights) - used)
    if extra:
        return f"sent weights the engine has no place for: {extra[:5]}"
    return plan


def _is_output_head(module: Any) -> bool:
    """An embedding-like module whose GEMM computes logits (vLLM's ``ParallelLMHead``)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    return isinstance(module, ParallelLMHead)


def _repack_at_first_use(module: Any) -> None:
    """Replace ``module.cpu_linear`` by one that packs ``module.weight`` as it is then (the
    GEMM handler vLLM would build now) and uses that from then on; the old handler, built
    from the old weights, is dropped now."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    def first_use(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        with torch.no_grad():
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)  # sets module.cpu_linear
        return module.cpu_linear(x, weight, bias)

    module.cpu_linear = first_use


@torch.no_grad()
def load_in_place(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> str | None:
    """Load ``weights`` (HF checkpoint names → tensors of the model's dtype, CPU) into the
    vLLM ``model`` in place.

    The sent tensors may be read-only views (e.g. of an object-store buffer): nothing keeps
    a reference to them afterwards (oneDNN copies a weight into its own packed layout).

    Returns:
        ``None`` when the weights were loaded; otherwise why this path does not apply (the
        model is then unchanged, and the caller uses vLLM's ``reload_weights``).
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    plan = _plan(model, weights)
    if isinstance(plan, str):
        return plan
    for param, src in plan.copies:
        param.copy_(src)

    def repack_linear(module: Any, ws: list[torch.Tensor], bs: list[torch.Tensor] | None) -> None:
        if bs is not None:
            module.bias.copy_(torch.cat(bs) if len(bs) > 1 else bs[0])
        w = module.weight
        if w.numel():  # the layer kept its weight: update it, then rebuild the GEMM from it
            w.copy_(_fused(ws))
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            return
        kept = w.data  # empty: vLLM dropped the weight after packing it
        w.data = _fused(ws).to(kept.dtype)  # (out, in), a view of the sent tensors where they are adjacent
        dispatch_cpu_unquantized_gemm(module, remove_weight=False)  # oneDNN packs its own copy
        w.data = kept

    @torch.no_grad()  # grad mode is per thread
    def repack(job: tuple) -> None:
        if len(job) == 1:
            dispatch_cpu_unquantized_gemm(job[0], remove_weight=False)
        else:
            repack_linear(*job)

    # An input embedding's GEMM handler (vLLM builds one for every embedding-like module)
    # is used only by models that multiply by the input embedding (its ``apply``; a Llama
    # looks rows up with ``F.embedding``): it is rebuilt from the new weight at its first
    # use instead of now (SmolLM2-135M fp32: 0.10 s of the 0.87 s of serial repacking).
    jobs: list[tuple] = []
    for m in plan.repack:
        if _is_output_head(m):
            jobs.append((m,))
        else:
            _repack_at_first_use(m)
    # oneDNN's weight reorder runs on one thread and releases the GIL: pack layers side by
    # side (SmolLM2-135M fp32, 2 cores: 0.30 s serial, 0.19 s on two threads), largest
    # first so that no big layer (the 49152 x 576 output head) is left for last.
    jobs += plan.linears
    jobs.sort(key=lambda job: -sum(int(w.numel()) for w in (job[1] if len(job) > 1 else [job[0].weight])))
    workers = max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for fut in [pool.submit(repack, job) for job in jobs]:
            fut.result()
    return None
