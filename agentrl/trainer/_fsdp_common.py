"""The building blocks ``PolicyTrainer`` and ``CriticTrainer`` share (put together once
in ``agentrl.trainer._core.TrainerCore``): loading a Hugging Face model for training,
FSDP2 sharding, the AdamW + warmup optimizer, and checkpoint / RNG state (the rank split
and micro-batching of rows are in ``agentrl.trainer.micro_batches``).

Every function here is either pure or collective over the default process group; the
collective ones say so. Both trainers follow the same contract (see ``trainer.py``): the
caller initialises the process group, then calls each public method on every rank with
the same full batch; rank ``r`` works on rows ``r, r + W, r + 2W, ...``; a rank with fewer
micro-batches than another runs dummy passes so FSDP's collectives line up.
"""

from __future__ import annotations

import logging
import os
import random
import warnings
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from agentrl.errors import CheckpointError, ConfigError
from agentrl.trainer.attention import resolve_attn_implementation

COMPLETE_MARKER = "COMPLETE"


class _ModelSource(Protocol):
    """The config fields ``load_hf_model`` reads (``TrainerConfig``, ``CriticConfig``)."""

    model_path: str
    attn_implementation: str


class _OptimConfig(Protocol):
    """The config fields ``build_optimizer`` reads."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    warmup_steps: int


# --------------------------------------------------------------------- process group


def require_process_group(owner: str) -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group.

    Raises:
        ConfigError: no initialised process group.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError(
            f"{owner} needs an initialised torch.distributed process group "
            "(gloo on CPU, nccl on CUDA); call torch.distributed.init_process_group(...) "
            "first, or agentrl.trainer.init_single_process_group() for one process"
        )
    return dist.get_rank(), dist.get_world_size()


def pick_device(kind: str, rank: int) -> torch.device:
    """``cpu``, or the CUDA device ``LOCAL_RANK`` (env) else ``rank % device_count``.

    Raises:
        ConfigError: ``kind == "cuda"`` without CUDA.
    """
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch.cuda.is_available() is False; use device='cpu'")
    index = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def all_reduce(t: torch.Tensor, op: Any, world_size: int) -> None:
    """In-place ``dist.all_reduce`` when there is more than one rank. Collective."""
    if world_size > 1:
        dist.all_reduce(t, op=op)


# --------------------------------------------------------------------- model


def load_hf_model(config: _ModelSource, *, causal_lm: bool = True) -> torch.nn.Module:
    """A Hugging Face model in fp32 (master weights), dropout off, on CPU (FSDP moves
    shards): ``AutoModelForCausalLM`` when ``causal_lm``, else ``AutoModel`` (the
    backbone without the LM head; a causal-LM checkpoint loads into it, its ``lm_head``
    ignored).

    ``config.attn_implementation`` goes through
    ``agentrl.trainer.attention.resolve_attn_implementation`` (``"auto"``: flash attention 2
    on CUDA in bf16 where installed, else the per-row SDPA kernel registered there).

    Dropout is switched off (every ``*dropout*`` float of the HF config set to 0, every
    ``nn.Dropout`` to ``p=0``) so that scoring is a deterministic function of the weights.

    Raises:
        ConfigError: ``config.model_path`` is not a loadable HF model folder.
    """
    from transformers import (  # heavy; loaded only to load a model
        AutoConfig,
        AutoModel,
        AutoModelForCausalLM,
    )

    try:
        hf_config = AutoConfig.from_pretrained(config.model_path)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"model_path={config.model_path!r} is not a Hugging Face model folder "
            f"(config.json + weights): {exc}"
        ) from exc
    for key, value in hf_config.to_dict().items():
        if "dropout" in key and isinstance(value, float):
            setattr(hf_config, key, 0.0)
    hf_config.use_cache = False
    attn = resolve_attn_implementation(
        config.attn_implementation, device=getattr(config, "device", "cpu"), dtype=getattr(config, "dtype", "float32")
    )
    kwargs = {"config": hf_config, "dtype": torch.float32, "attn_implementation": attn}
    try:
        if causal_lm:
            model = AutoModelForCausalLM.from_pretrained(config.model_path, **kwargs)
        else:
            # A causal-LM checkpoint's lm_head is reported as an "unexpected key" by
            # transformers' load report; that is expected here, so the report is silenced
            # and *missing* / mismatched backbone weights are checked below instead.
            hf_logger = logging.getLogger("transformers.modeling_utils")
            level = hf_logger.level
            hf_logger.setLevel(logging.ERROR)
            try:
                model, info = AutoModel.from_pretrained(config.model_path, output_loading_info=True, **kwargs)
            finally:
                hf_logger.setLevel(level)
            bad = sorted(info.get("missing_keys") or []) + sorted(str(k) for k in info.get("mismatched_keys") or [])
            if bad:
                raise ConfigError(
                    f"model_path={config.model_path!r}: the base model would start with "
                    f"{len(bad)} randomly initialised or mismatched weight(s) (e.g. {bad[:3]}); "
                    "point the critic at a checkpoint of the same architecture"
                )
    except (OSError, ValueError) as exc:
        what = "a causal LM" if causal_lm else "a base model (AutoModel)"
        raise ConfigError(f"could not load {what} from model_path={config.model_path!r}: {exc}") from exc
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks to shard one by one: modules whose class HF lists in
    ``_no_split_modules`` (e.g. ``LlamaDecoderLayer``) of ``model`` or any submodule.

    Raises:
        ConfigError: no such class is declared or found.
    """
    names: set[str] = set()
    for m in model.modules():
        names |= set(getattr(m, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ConfigError(
            f"{type(model).__name__} declares no decoder layer class (_no_split_modules="
            f"{sorted(names)}); cannot shard it layer by layer"
        )
    return layers


def shard_fsdp2(model: torch.nn.Module, *, device: torch.device, world_size: int, dtype: str) -> None:
    """Apply FSDP2 in place: ``fully_shard`` each decoder layer, then the root.

    With ``dtype == "bfloat16"``: ``MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32)``; fp32 master weights either way. Gradients are *summed* across
    ranks (divide factor 1, plain SUM collectives: gloo lacks PREMUL_SUM), because both
    trainers already divide their loss by the global count of the step. Collective.
    """
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("fsdp",))
    if dtype == "bfloat16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)


def build_optimizer(
    params: Any, config: _OptimConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and a linear-warmup-then-constant schedule: the factor of optimizer step
    ``k`` (0-based) is ``min(1, (k + 1) / warmup_steps)`` (1 without warmup)."""
    optimizer = torch.optim.AdamW(
        params, lr=config.lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay
    )
    warmup = config.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda=lambda k: min(1.0, (k + 1) / warmup) if warmup > 0 else 1.0
    )
    return optimizer, scheduler


def clip_grad_norm(model: torch.nn.Module, max_norm: float | None) -> float:
    """Clip the global gradient L2 norm (over all ranks' shards); return it pre-clip.
    Collective for sharded (``DTensor``) gradients."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm if max_norm is not None else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def storage_ptr(t: torch.Tensor) -> int:
    """Data pointer of ``t``'s (local) storage, to detect tensors aliasing parameters."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.untyped_storage().data_ptr()


# --------------------------------------------------------------------- RNG and checkpoints


def seed_everything(seed: int) -> None:
    """Seed ``random``, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """torch (and CUDA), numpy and ``random`` RNG states, loadable with ``weights_only``."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    global_step: int,
    config: Any,
    rank: int,
    world_size: int,
) -> None:
    """Write a trainer checkpoint to ``path``. Collective. The layout is the one
    ``PolicyTrainer.save_checkpoint`` documents (``dcp/`` shards, ``trainer_state.pt``,
    ``rng_rank{r}.pt``, ``COMPLETE`` last).

    Raises:
        CheckpointError: ``path`` already holds a complete checkpoint.
    """
    path = Path(path)
    if (path / COMPLETE_MARKER).exists():
        raise CheckpointError(f"{path} already holds a checkpoint; refusing to overwrite it")
    path.mkdir(parents=True, exist_ok=True)
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path / "dcp"))
    torch.save(rng_state(), path / f"rng_rank{rank}.pt")
    if rank == 0:
        torch.save(
            {
                "global_step": global_step,
                "scheduler": scheduler.state_dict(),
                "world_size": world_size,
                "config": asdict(config) if is_dataclass(config) else config,
            },
            path / "trainer_state.pt",
        )
    dist.barrier()
    if rank == 0:
        (path / COMPLETE_MARKER).write_text("ok\n")
    dist.barrier()


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank: int,
    world_size: int,
    warn_stacklevel: int = 3,
) -> int:
    """Restore what ``save_checkpoint`` wrote into ``model``, ``optimizer``,
    ``scheduler`` and this rank's RNG; return the saved ``global_step``. Collective.

    RNG states are per rank: on a different world size, ranks without a saved state keep
    their current one (with a warning); model and optimizer re-shard to the new world size.

    ``warn_stacklevel`` points that warning at the caller's caller.

    Raises:
        CheckpointError: ``path`` is not a complete checkpoint, or its tensors do not match.
    """
    path = Path(path)
    if not (path / COMPLETE_MARKER).exists() or not (path / "trainer_state.pt").exists():
        raise CheckpointError(
            f"{path} is not a complete trainer checkpoint (missing {COMPLETE_MARKER} or "
            "trainer_state.pt); it was never written or its writer crashed"
        )
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    try:
        dcp.load(state, checkpoint_id=str(path / "dcp"))
    except Exception as exc:  # DCP raises several types for mismatched/corrupt data
        raise CheckpointError(f"could not load model/optimizer state from {path / 'dcp'}: {exc}") from exc
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    meta = torch.load(path / "trainer_state.pt", weights_only=True)
    scheduler.load_state_dict(meta["scheduler"])
    rng_file = path / f"rng_rank{rank}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=True))
    else:
        warnings.warn(
            f"{rng_file} missing (checkpoint written by {meta['world_size']} ranks, now "
            f"{world_size}); rank {rank} keeps its current RNG state",
            stacklevel=warn_stacklevel,
        )
    dist.barrier()
    return int(meta["global_step"])


def same_on_all_ranks(values: Sequence[float], device: torch.device, world_size: int) -> bool:
    """Whether every rank passed the same ``values`` (e.g. a batch fingerprint).
    Collective (two MAX all-reduces)."""
    fp = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    hi, lo = fp.clone(), -fp
    all_reduce(hi, dist.ReduceOp.MAX, world_size)
    all_reduce(lo, dist.ReduceOp.MAX, world_size)
    return bool(torch.equal(hi, -lo))


def all_gather_concat(t: torch.Tensor, device: torch.device, world_size: int) -> torch.Tensor:
    """Every rank's 1-D float ``t`` (any length), concatenated in rank order, on every rank,
    as float32. Collective (two all-gathers: the lengths, then ``t`` padded to the
    longest).

    Exact, not a histogram: every rank ends with the same numbers, so a quantile or a max
    computed from them equals the one-rank value.
    """
    if world_size == 1:
        return t
    n = torch.tensor([t.numel()], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(n) for _ in range(world_size)]
    dist.all_gather(counts, n)
    sizes = [int(c) for c in counts]
    padded = torch.zeros(max(max(sizes), 1), dtype=torch.float32, device=device)  # (max_n,)
    padded[: t.numel()] = t.float()
    bufs = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(bufs, padded)
    return torch.cat([b[:k] for b, k in zip(bufs, sizes)])  # (sum n,)


def full_state_dict(
    model: torch.nn.Module, *, rank: int, world_size: int, dtype: torch.dtype | None, copy: bool, tied_copies: bool
) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights of FSDP2 ``model`` with HF parameter names, on CPU:
    ``{hf_name: tensor}`` on rank 0, ``{}`` elsewhere (``PolicyTrainer.full_state_dict``
    documents ``dtype``, ``copy`` and ``tied_copies``). Collective."""
    if world_size == 1:
        # One rank: every DTensor's local shard is the whole tensor (same keys and storage
        # as get_model_state_dict's, measured 10 ms vs 50 ms for SmolLM2-135M on CPU).
        sd = {}
        for k, v in model.state_dict().items():
            v = v.to_local() if hasattr(v, "to_local") else v
            sd[k] = v if v.device.type == "cpu" else v.cpu()
    else:
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return {}
    if not tied_copies:
        for target, source in (getattr(model, "all_tied_weights_keys", None) or {}).items():
            if source in sd:
                sd.pop(target, None)
    # On CPU with one rank the "gathered" tensors are the live parameters themselves;
    # copy those, or the caller's dict would change with the next optimizer step.
    live = {storage_ptr(p) for p in model.parameters()} if copy else set()
    out = {}
    for k, v in sd.items():
        if storage_ptr(v) in live:
            v = v.clone()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        out[k] = v
    return out
