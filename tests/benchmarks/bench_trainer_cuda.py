"""Benchmark for a CUDA machine: ``PolicyTrainer.step`` on a ~0.5B model in bf16 under
FSDP2 + NCCL, packed 16k-token micro-batches; tokens/s, MFU and peak memory, with the
packed / padded and trainer / bare-PyTorch ratios measured in the same run.

Run on demand (pytest does not collect this file; nothing in CI depends on it)::

    # one GPU (a process group of one; no launcher needed)
    .venv/bin/python tests/benchmarks/bench_trainer_cuda.py --json bench.json
    # N GPUs of one machine
    .venv/bin/torchrun --standalone --nproc-per-node N tests/benchmarks/bench_trainer_cuda.py
    # a real model folder instead of the random one
    .venv/bin/python tests/benchmarks/bench_trainer_cuda.py --model PATH
    # the anchor's shape (Qwen3-0.6B without its q/k norms, ~0.6B)
    .venv/bin/python tests/benchmarks/bench_trainer_cuda.py --shape qwen3-0.6b
    # check the script without a GPU: the same code path, gloo, a tiny model, < 1 min
    .venv/bin/python tests/benchmarks/bench_trainer_cuda.py --device cpu --tiny

Without ``--model``, rank 0 builds a ``LlamaConfig`` model with random weights (fixed
seed) and ``save_pretrained``s it into a temporary folder, which ``PolicyTrainer`` then
loads like any model folder (removed at the end). ``--shape llama-0.5b`` (default):
hidden 1024, 24 layers, 16 heads of 64, 8 KV heads (GQA), intermediate 3072, vocabulary
151,936 (Qwen2's), tied embeddings: 457,622,528 parameters (the count is printed).

Rows: synthetic agentic rows, fixed seed, identical on every rank (the trainer's
contract): lengths log-uniform in [1,024, 8,192] tokens until ``--tokens-per-gpu`` x
world size tokens; each row a prompt (15 %) and 1 to 6 turns, the last part of each turn
being the model's reply under ``loss_mask``, so about a quarter of the tokens carry a loss,
as in the issue's default job; advantages +1 / -1 per row, random token ids and
behavior log-probs (on-policy, rollout correction and KL off).

Measured, one after the other in this process (each freed before the next), one warm-up
step on the full batch, then ``--steps`` timed steps between ``torch.cuda.synchronize()``
calls (the slowest rank's time per step):

* ``trainer packed``: ``PolicyTrainer.step``, ``row_layout="packed"``, micro-batches
  bin-packed to ``--micro-batch-tokens`` (16,384), ``dtype="bfloat16"`` (FSDP2
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, fp32 master weights and
  AdamW state), ``flash_attention_2`` when ``flash_attn`` imports, else ``auto`` (our
  per-row SDPA kernel), the LM head only at loss positions.
* ``trainer padded``: the same with ``row_layout="padded"``: rows in order, right-padded,
  at most ``--micro-batch-tokens`` padded tokens (rows x longest row) per micro-batch.
* ``bare packed``: a plain ``AutoModelForCausalLM`` (fp32 weights, ``torch.autocast``
  bf16, no FSDP, no gradient all-reduce), the trainer's packed micro-batches and attention
  kernel, the LM head at the loss positions, on-policy PPO token-mean loss, backward,
  gradient clipping at 1.0, ``torch.optim.AdamW`` with the trainer's defaults: the same
  loss as ``bench_trainer.py``'s bare loop (which is written for the CPU; this one runs
  on any device). With N ranks each rank runs it on its own rows, as the trainer splits
  them.

Printed: tokens/s per GPU and in total, MFU, the step's peak memory
(``torch.cuda.max_memory_allocated``, reset at each step), the ratios, the anchor
("a peer reports 11.9k tokens/s and 11.1 % MFU for a 0.6B model at 16k packed
tokens on one H100"), and last one JSON line with every number.

MFU = model FLOPs of the step / (step seconds x GPUs x peak bf16 dense FLOP/s). Model
FLOPs, forward + backward, after PaLM (Chowdhery et al. 2022, Appendix B: 6N + 12LHQT
per token; the same count as Megatron-LM's, Narayanan et al. 2021, Sec. 5.1):

    6 * N * T  +  6 * L * H*Q * sum over rows of s**2

with T the batch's tokens, N the parameters that enter a matmul (all but the input
embedding lookup; a tied embedding is counted once, as the LM head), L layers, H*Q the
query heads times head dim, s each row's length. PaLM's attention term 12LHQT per token
counts the full s x s score matrix of each row; causal attention computes half of it,
which is what is counted here (FlashAttention-2, Dao 2023, Sec. 4.1, counts causal
attention the same way); ``mfu_palm`` in the JSON keeps PaLM's full term. Both count the
LM head on every token, as a plain training step runs it; the trainer runs it only at
the T_loss positions it reads, so ``mfu_head_at_loss`` also gives the FLOPs that step
needs (6 * V*H * (T - T_loss) fewer). Gradient-checkpointing recompute is not model
FLOPs (PaLM). Peak bf16 dense FLOP/s from the device name (H100 SXM and H200: 989
TFLOP/s, H100 PCIe 756, A100 312; ``--peak-tflops`` overrides; unknown: no MFU).

Sized for one H200: a model build, then three variants of (1 + 3) steps of 65,536 tokens
(about 227 model TFLOP each; five packed micro-batches): estimated at 2 to 4 minutes in
all, well under 10 (not yet run on a GPU when written). Every variant is charged the same
model FLOPs (the rows' own tokens), so padding shows as lower MFU.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout

ANCHOR = {
    "text": "a peer reports 11.9k tokens/s and 11.1 % MFU for a 0.6B model at 16k packed tokens on one H100",
    "tokens_per_s_per_gpu": 11900.0,
    "mfu": 0.111,
    "params": 0.6e9,
    "source": "a peer's report: 0.6B model, 16k packed tokens, one H100",
}

PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    # dense bf16 tensor-core peak (NVIDIA data sheets; no 2:4 sparsity), matched in order
    ("H200", 989.0),
    ("H100 PCIE", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
)

SHAPES: dict[str, dict] = {
    # Llama / Qwen2-shaped ~0.5B: 457.7M parameters
    "llama-0.5b": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=64, intermediate_size=3072, vocab_size=151936),
    # the anchor's size: Qwen3-0.6B's dimensions (Llama blocks, so without its q/k norms): 596.0M
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=151936),
    # --tiny: the same code path on a CPU in seconds
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, intermediate_size=128, vocab_size=8192),
}

VARIANTS = ("trainer_packed", "trainer_padded", "bare_packed")
LABELS = {
    "trainer_packed": "trainer packed (head at loss)",
    "trainer_padded": "trainer padded (head at loss)",
    "bare_packed": "bare packed (head at loss)",
}
PADDED_ROWS_CAP = 256
"""``micro_batch_size`` of the padded variant: large, so the token cap (rows x longest row
<= ``--micro-batch-tokens``) decides, and padded micro-batches hold as many tokens as packed
ones at most."""


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(msg, flush=True)


# ---------------------------------------------------------------- model and rows


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs of a model (from its config, built on the meta device).

    Attributes:
        n_params: every parameter, tied ones once.
        n_matmul: parameters that enter a matmul: all but the input embedding, plus the LM
            head counted once when it is tied to that embedding.
        n_layers, hidden, attn_dim (query heads x head dim), vocab: from the config.
        tied: whether the LM head is the input embedding.
    """

    n_params: int
    n_matmul: int
    n_layers: int
    hidden: int
    attn_dim: int
    vocab: int
    tied: bool


def model_shape(model_path: str) -> ModelShape:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = head is emb
    n_params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    n_matmul = n_params - emb.numel() + (head.numel() if tied else 0)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelShape(
        n_params=n_params, n_matmul=n_matmul, n_layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
        attn_dim=cfg.num_attention_heads * head_dim, vocab=int(emb.shape[0]), tied=tied,
    )


def build_random_model(shape: str, out_dir: Path, seed: int) -> Path:
    """A ``LlamaForCausalLM`` of ``SHAPES[shape]`` with random weights (seed ``seed``),
    saved with ``save_pretrained`` (fp32 safetensors, tied embeddings stored once)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, attention_dropout=0.0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out_dir)
    del model
    return out_dir


def agentic_rows(total_tokens: int, min_len: int, max_len: int, vocab: int, seed: int, loss_frac: float = 0.25,
                 prompt_frac: float = 0.15) -> list:
    """Synthetic multi-turn rows (``TokenSequence``) of ``total_tokens`` tokens or a few
    more: lengths log-uniform in ``[min_len, max_len]``; each row a prompt of
    ``prompt_frac`` of its tokens, then 1 to 6 turns whose last tokens are the reply
    (``loss_mask`` 1), sized so that ``loss_frac`` of the row's tokens carry a loss.
    Advantages +1 / -1 by row, behavior log-probs uniform in (-3, 0]."""
    import torch

    from agentrl.types import TokenSequence

    g = torch.Generator().manual_seed(seed)
    rows, total, i = [], 0, 0
    lo, hi = math.log(min_len), math.log(max_len)
    while total < total_tokens:
        n = int(round(math.exp(lo + (hi - lo) * float(torch.rand(1, generator=g)))))
        turns = int(torch.randint(1, 7, (1,), generator=g))
        prompt = max(1, int(round(prompt_frac * n)))
        reply_share = loss_frac * n / (n - prompt)
        mask = [0] * prompt
        bounds = torch.linspace(prompt, n, turns + 1).round().long().tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):
            reply = int(round(reply_share * (b - a)))
            mask += [0] * (b - a - reply) + [1] * reply
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        n_loss = sum(mask)
        blp = (-torch.rand(n_loss, generator=g) * 3).tolist()
        adv = 1.0 if i % 2 == 0 else -1.0
        rows.append(TokenSequence(ids, mask, blp, [adv * m for m in mask], f"g{i // 4}", 0, f"synthetic-{i}"))
        total += n
        i += 1
    return rows


def step_flops(shape: ModelShape, lens: list[int], n_loss: int) -> dict[str, float]:
    """Model FLOPs of one forward + backward over rows of lengths ``lens`` (the module
    docstring gives the formula and its sources)."""
    tokens = sum(lens)
    sq = float(sum(s * s for s in lens))
    dense = 6.0 * shape.n_matmul * tokens
    attn_causal = 6.0 * shape.n_layers * shape.attn_dim * sq
    head_skipped = 6.0 * shape.vocab * shape.hidden * (tokens - n_loss)
    return {
        "model": dense + attn_causal,
        "palm": dense + 2.0 * attn_causal,  # PaLM's 12LHQT: the full s x s score matrix
        "head_at_loss": dense + attn_causal - head_skipped,
        "dense": dense,
        "attention_causal": attn_causal,
    }


def peak_tflops(device_name: str, override: float | None) -> tuple[float | None, str]:
    if override is not None:
        return override, "--peak-tflops"
    name = device_name.upper()
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in name:
            return tflops, f"table ({key})"
    return None, f"unknown device {device_name!r}: pass --peak-tflops"


# ---------------------------------------------------------------- process group


def init_process_group(device: str) -> tuple[int, int]:
    """``(rank, world_size)``: the launcher's group under ``torchrun`` (env ``RANK`` /
    ``WORLD_SIZE``), else a group of one (``init_single_process_group``). NCCL on CUDA,
    gloo on CPU."""
    import torch
    import torch.distributed as dist

    from agentrl.trainer import init_single_process_group

    backend = "nccl" if device == "cuda" else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        if device == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            if local >= torch.cuda.device_count():
                raise SystemExit(f"LOCAL_RANK={local} but only {torch.cuda.device_count()} CUDA device(s) are visible; "
                                 "use --nproc-per-node <= the number of GPUs")
            torch.cuda.set_device(local)
        dist.init_process_group(backend=backend)
    else:
        if device == "cuda":
            torch.cuda.set_device(0)
        init_single_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def broadcast_str(value: str | None, rank: int) -> str:
    import torch.distributed as dist

    box = [value if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ---------------------------------------------------------------- timing


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def slowest_rank(seconds: list[float], device, world: int) -> list[float]:
    """Each step's time on the slowest rank (all-reduce MAX)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(seconds, dtype=torch.float64, device=device)  # (S,)
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def timed_steps(step, steps: int, device, world: int) -> tuple[list[float], float, dict]:
    """Warm-up ``step()`` once, then ``steps`` timed calls; per-step seconds (slowest
    rank), the largest per-step peak memory (MB) and the last call's return value."""
    from agentrl.trainer import memory

    meter = memory.PeakMemory(device)
    step()
    times, peaks, last = [], [], {}
    for _ in range(steps):
        meter.start()
        sync(device)
        t0 = time.perf_counter()
        last = step() or {}
        sync(device)
        times.append(time.perf_counter() - t0)
        peaks.append(meter.peak_mb())
    return slowest_rank(times, device, world), max(peaks), last


def free(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def resident_mb(device) -> float:
    """Memory held between steps (weights, gradients, AdamW state): CUDA allocated, else
    the process's resident set."""
    import torch

    from agentrl.trainer import memory

    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return memory._rss_kb() / 1024.0


# ---------------------------------------------------------------- variants


def run_trainer(layout: str, args: argparse.Namespace, model_path: str, attn: str, batch) -> dict:
    """``PolicyTrainer.step`` in ``layout``; the trainer is freed before returning."""
    from agentrl.trainer import PolicyTrainer, TrainerConfig

    cfg = TrainerConfig(
        model_path=model_path, dtype=args.dtype, device=args.device, attn_implementation=attn, row_layout=layout,
        micro_batch_tokens=args.micro_batch_tokens, micro_batch_size=PADDED_ROWS_CAP,
        gradient_checkpointing=args.gradient_checkpointing, seed=args.seed,
    )
    trainer = PolicyTrainer(cfg)
    device, world = trainer.device, trainer.world_size
    kernel = trainer.model.config._attn_implementation
    times, peak, m = timed_steps(lambda: trainer.step(batch).metrics, args.steps, device, world)
    out = {
        "step_s": times, "step_peak_mb": peak, "resident_mb": resident_mb(device), "attn_kernel": kernel,
        "micro_batches": len(trainer._core.micro_batches(trainer._my_rows(batch), batch.seq_lens.tolist(), layout)),
        **{k: m.get(k) for k in ("perf/tokens_per_s", "perf/step_s", "perf/peak_memory_mb", "perf/padding_frac",
                                 "actor/pg_loss", "actor/grad_norm", "actor/num_loss_tokens")},
    }
    del trainer, m
    free(device)
    return out


def bare_step(model, opt, batch, rows: list[int], budget: int, device, autocast_dtype) -> None:
    """One bare forward / backward / AdamW pass over ``rows`` of ``batch``: the trainer's
    packed micro-batches (``micro_batches.pack_micro_batches``, ``packing.model_inputs``), the
    LM head on the positions before loss tokens, on-policy PPO token-mean loss (ratio
    ``exp(lp - lp.detach())``, clip 0.2, as ``bench_trainer.py``'s bare loop), gradient
    clipping at 1.0, AdamW."""
    import torch

    from agentrl.trainer import micro_batches, packing

    lens = batch.seq_lens.tolist()
    sub_all = batch.select_rows(rows)
    n_loss = float(sub_all.loss_mask.sum())
    temperature = batch.sampling.temperature
    backbone = getattr(model, model.base_model_prefix)
    head = model.get_output_embeddings()
    opt.zero_grad(set_to_none=True)
    for group in micro_batches.pack_micro_batches(rows, lens, budget):
        sub = batch.select_rows(group)
        inp = packing.model_inputs(sub.input_ids, sub.position_ids, sub.seq_lens.tolist(), "packed", device)
        targets = torch.nonzero(sub.loss_mask > 0).flatten().to(device)  # (n,)
        select = inp.flat_index[targets - 1]  # (n,) the position before each loss token
        labels = sub.input_ids.to(device)[targets]  # (n,)
        adv = sub.advantages.to(device)[targets]  # (n,)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            hidden = backbone(input_ids=inp.input_ids, position_ids=inp.position_ids, attention_mask=None,
                              use_cache=False, **inp.attn_kwargs).last_hidden_state  # (1, Tm, H)
            logits = head(hidden.reshape(-1, hidden.shape[-1])[select])  # (n, V)
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (n, V) fp32
        lp = logp.gather(-1, labels[:, None]).squeeze(-1)  # (n,)
        ratio = torch.exp(lp - lp.detach())  # (n,) 1, with the policy gradient
        loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).sum() / n_loss
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def run_bare(args: argparse.Namespace, model_path: str, attn: str, batch, rank: int, world: int, device) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.trainer import attention, micro_batches
    from agentrl.trainer.config import TrainerConfig

    kernel = attention.resolve_attn_implementation(attn, device=device.type, dtype=args.dtype)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation=kernel).to(device)
    model.train()
    for m in model.modules():  # as the trainer: dropout off
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    d = TrainerConfig(model_path=model_path)  # the trainer's AdamW defaults
    opt = torch.optim.AdamW(model.parameters(), lr=d.lr, betas=d.betas, eps=d.eps, weight_decay=d.weight_decay)
    rows = list(range(rank, batch.num_rows, world))  # the trainer's rank split
    autocast_dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    times, peak, _ = timed_steps(
        lambda: bare_step(model, opt, batch, rows, args.micro_batch_tokens, device, autocast_dtype),
        args.steps, device, world,
    )
    out = {"step_s": times, "step_peak_mb": peak, "resident_mb": resident_mb(device),
           "attn_kernel": model.config._attn_implementation,
           "micro_batches": len(micro_batches.pack_micro_batches(rows, batch.seq_lens.tolist(), args.micro_batch_tokens))}
    del model, opt
    free(device)
    return out


# ---------------------------------------------------------------- driver


def pick_attn(requested: str | None, device: str) -> tuple[str, str]:
    """The ``attn_implementation`` to configure and why."""
    if requested:
        return requested, "--attn"
    if device != "cuda":
        return "auto", "no CUDA: auto (agentrl_varlen_sdpa)"
    try:
        import flash_attn  # noqa: F401

        return "flash_attention_2", f"flash_attn {getattr(flash_attn, '__version__', '?')} imports"
    except Exception as exc:  # ImportError, or a broken build's OSError / undefined symbol
        return "auto", f"flash_attn does not import ({type(exc).__name__}: {exc}); auto (agentrl_varlen_sdpa)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="Hugging Face model folder (default: a random model of --shape, built here)")
    p.add_argument("--shape", choices=[s for s in SHAPES if s != "tiny"], default="llama-0.5b",
                   help="shape of the random model (default llama-0.5b)")
    p.add_argument("--tiny", action="store_true", help="a tiny random model and short rows (a quick check of the script)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu only with --tiny")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="compute dtype (default bfloat16)")
    p.add_argument("--attn", choices=("auto", "sdpa", "flash_attention_2", "agentrl_varlen_sdpa"),
                   help="attention kernel (default: flash_attention_2 when flash_attn imports, else auto)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant, after one warm-up step (default 3)")
    p.add_argument("--tokens-per-gpu", type=int, help="batch tokens per GPU (default 65,536; --tiny 4,096)")
    p.add_argument("--micro-batch-tokens", type=int, help="packed micro-batch budget (default 16,384; --tiny 1,024)")
    p.add_argument("--min-len", type=int, help="shortest row (default 1,024; --tiny 64)")
    p.add_argument("--max-len", type=int, help="longest row (default 8,192; --tiny 512)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute layer activations in backward")
    p.add_argument("--only", nargs="+", choices=VARIANTS, help="measure only these variants")
    p.add_argument("--peak-tflops", type=float, help="peak dense bf16 TFLOP/s per device (default: from its name)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random model and the rows")
    p.add_argument("--json", type=Path, help="also write the JSON result here (rank 0)")
    p.add_argument("--keep-model", action="store_true", help="keep the random model's folder (its path is printed)")
    args = p.parse_args(argv)
    small = args.tiny
    args.tokens_per_gpu = args.tokens_per_gpu or (4096 if small else 65536)
    args.micro_batch_tokens = args.micro_batch_tokens or (1024 if small else 16384)
    args.min_len = args.min_len or (64 if small else 1024)
    args.max_len = args.max_len or (512 if small else 8192)
    if not 1 <= args.min_len <= args.max_len:
        p.error(f"--min-len {args.min_len} / --max-len {args.max_len}: expected 1 <= min <= max")
    if args.steps < 1:
        p.error(f"--steps {args.steps}: expected >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_trainer_cuda: no CUDA device here (torch.cuda.is_available() is False, torch "
              f"{torch.__version__}); this benchmark needs a CUDA GPU. To check the script on a CPU: "
              f"{Path(__file__).name} --device cpu --tiny", file=sys.stderr)
        return 2
    if args.device == "cpu" and not args.tiny:
        print("bench_trainer_cuda: --device cpu runs only with --tiny (a 0.5B model on a CPU would take hours)",
              file=sys.stderr)
        return 2
    if args.device == "cpu":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.attn == "flash_attention_2" and (args.device != "cuda" or args.dtype != "bfloat16"):
        print("bench_trainer_cuda: --attn flash_attention_2 needs --device cuda and --dtype bfloat16", file=sys.stderr)
        return 2

    import torch.distributed as dist
    import transformers

    from agentrl.trainer import attention

    transformers.utils.logging.disable_progress_bar()
    from agentrl.types import SamplingRecord, TokenBatch

    rank, world = init_process_group(args.device)
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    t_start = time.perf_counter()
    tmp_dir = None
    try:
        # ---- model
        if args.model:
            model_path, source = args.model, f"model folder {args.model}"
        else:
            shape_name = "tiny" if args.tiny else args.shape
            built = None
            if rank == 0:
                tmp_dir = Path(tempfile.mkdtemp(prefix="bench-trainer-cuda-"))
                t0 = time.perf_counter()
                built = str(build_random_model(shape_name, tmp_dir / "model", args.seed))
                log(rank, f"built a random {shape_name} model (seed {args.seed}) in {time.perf_counter() - t0:.1f} s: {built}")
            model_path = broadcast_str(built, rank)
            source = f"random LlamaConfig model, shape {shape_name}, seed {args.seed} (save_pretrained, fp32)"
        shape = model_shape(model_path)

        # ---- rows (the same on every rank)
        rows = agentic_rows(args.tokens_per_gpu * world, args.min_len, args.max_len, shape.vocab, args.seed)
        batch = TokenBatch.pack(rows, SamplingRecord())
        lens = batch.seq_lens.tolist()
        n_tok, n_loss = batch.num_tokens, batch.num_loss_tokens
        flops = step_flops(shape, lens, n_loss)
        attn, attn_why = pick_attn(args.attn, args.device)
        resolved = attention.resolve_attn_implementation(attn, device=args.device, dtype=args.dtype)
        if device.type == "cuda":
            dev_name = torch.cuda.get_device_name(device)
            peak, peak_src = peak_tflops(dev_name, args.peak_tflops)
        else:
            dev_name = f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
            peak, peak_src = (args.peak_tflops, "--peak-tflops") if args.peak_tflops else (None, "CPU: no peak, no MFU")

        log(rank, f"device: {world} x {dev_name}; torch {torch.__version__} (CUDA {torch.version.cuda}), "
                  f"transformers {transformers.__version__}; backend {dist.get_backend()}")
        log(rank, f"model: {source}")
        log(rank, f"  {shape.n_params:,} parameters ({shape.n_params / 1e6:.1f}M; {shape.n_matmul:,} in matmuls), "
                  f"{shape.n_layers} layers, hidden {shape.hidden}, attention {shape.attn_dim}, vocabulary "
                  f"{shape.vocab:,}, {'tied' if shape.tied else 'untied'} embeddings")
        log(rank, f"rows: {len(lens)} synthetic agentic rows of {min(lens):,}..{max(lens):,} tokens, {n_tok:,} tokens "
                  f"({n_tok / world:,.0f} per GPU), {n_loss:,} loss tokens ({n_loss / n_tok:.1%})")
        log(rank, f"step: dtype {args.dtype} (FSDP2 MixedPrecisionPolicy param bf16, reduce fp32)" if args.dtype == "bfloat16"
                  else f"step: dtype {args.dtype}")
        log(rank, f"  attention: {attn} -> {resolved} ({attn_why}); micro-batch budget {args.micro_batch_tokens:,} "
                  f"tokens; gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}; "
                  f"1 warm-up + {args.steps} timed step(s) per variant")
        log(rank, f"  model FLOPs per step {flops['model'] / 1e12:.2f} TFLOP (dense {flops['dense'] / 1e12:.2f}, causal "
                  f"attention {flops['attention_causal'] / 1e12:.2f}); peak {peak if peak else '-'} TFLOP/s per device "
                  f"({peak_src})")

        results: dict[str, dict] = {}
        for v in args.only or VARIANTS:
            t0 = time.perf_counter()
            if v.startswith("trainer"):
                r = run_trainer(v.split("_")[1], args, model_path, attn, batch)
            else:
                r = run_bare(args, model_path, attn, batch, rank, world, device)
            step_s = sum(r["step_s"]) / len(r["step_s"])
            r["step_s_mean"] = step_s
            r["tokens_per_s"] = n_tok / step_s
            r["tokens_per_s_per_gpu"] = n_tok / step_s / world
            denom = step_s * world * peak * 1e12 if peak else None
            r["mfu"] = flops["model"] / denom if denom else None
            r["mfu_palm"] = flops["palm"] / denom if denom else None
            r["mfu_head_at_loss"] = flops["head_at_loss"] / denom if denom else None
            r["wall_s"] = time.perf_counter() - t0
            results[v] = r
            mfu_txt = (f"MFU {r['mfu']:6.1%} (PaLM count {r['mfu_palm']:.1%}, head-at-loss count "
                       f"{r['mfu_head_at_loss']:.1%})" if r["mfu"] is not None else "MFU -")
            pad = r.get("perf/padding_frac")
            log(rank, f"{LABELS[v]:30s} {r['tokens_per_s_per_gpu']:9,.0f} tokens/s per GPU ({r['tokens_per_s']:,.0f} total)  "
                      f"step {step_s:6.2f} s [{', '.join(f'{t:.2f}' for t in r['step_s'])}]  {mfu_txt}  "
                      f"peak {r['step_peak_mb'] / 1024:6.2f} GB (held {r['resident_mb'] / 1024:.2f} GB)  "
                      f"{r['micro_batches']} micro-batches/GPU  kernel {r['attn_kernel']}"
                      + (f"  padding {pad:.1%}" if pad is not None else "")
                      + f"  ({r['wall_s']:.0f} s)")

        def ratio(a: str, b: str) -> float | None:
            return results[a]["tokens_per_s"] / results[b]["tokens_per_s"] if a in results and b in results else None

        ratios = {
            "trainer_packed/bare_packed": ratio("trainer_packed", "bare_packed"),
            "trainer_packed/trainer_padded": ratio("trainer_packed", "trainer_padded"),
        }
        targets = {"trainer_packed/bare_packed": 0.9, "trainer_packed/trainer_padded": 1.3}
        log(rank, "ratios (tokens/s; the targets were set on CPU, shown for reference):")
        for k, val in ratios.items():
            if val is not None:
                log(rank, f"  {k:32s} {val:5.2f}x   target >= {targets[k]}x: {'met' if val >= targets[k] else 'missed'}")
        tp = results.get("trainer_packed")
        if args.tiny:
            log(rank, "  (--tiny: a check that the script runs; its numbers say nothing about the trainer's speed)")
        elif tp:
            vs = tp["tokens_per_s_per_gpu"] / ANCHOR["tokens_per_s_per_gpu"]
            mfu_vs = f", MFU {tp['mfu']:.1%} vs {ANCHOR['mfu']:.1%}" if tp["mfu"] is not None else ""
            log(rank, f"anchor: {ANCHOR['text']}")
            log(rank, f"  trainer packed: {tp['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU = {vs:.2f}x the anchor's "
                      f"{ANCHOR['tokens_per_s_per_gpu']:,.0f}{mfu_vs} ({shape.n_params / 1e6:,.1f}M parameters here vs 600M; "
                      "MFU is the size-independent comparison)")
        summary = {
            "bench": "bench_trainer_cuda",
            "device": dev_name, "world_size": world, "backend": dist.get_backend(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "model": source, "model_shape": asdict(shape),
            "dtype": args.dtype, "attn_implementation": attn, "attn_resolved": resolved,
            "micro_batch_tokens": args.micro_batch_tokens, "gradient_checkpointing": args.gradient_checkpointing,
            "steps": args.steps, "rows": len(lens), "tokens": n_tok, "loss_tokens": n_loss,
            "row_len_min": min(lens), "row_len_max": max(lens),
            "flops_per_step": flops, "peak_tflops": peak, "peak_tflops_source": peak_src,
            "flops_formula": "6*N_matmul*T + 6*L*(heads*head_dim)*sum(s^2) (PaLM App. B with causal attention "
                             "halved; mfu_palm: full 12LHQT; mfu_head_at_loss: minus 6*V*H*(T-T_loss))",
            "results": results, "ratios": ratios, "anchor": ANCHOR,
            "total_wall_s": time.perf_counter() - t_start,
        }
        if rank == 0:
            line = json.dumps(summary, sort_keys=True)
            if args.json:
                args.json.write_text(line + "\n")
            print(line, flush=True)
    finally:
        if rank == 0 and tmp_dir is not None:
            if args.keep_model:
                print(f"kept the model folder: {tmp_dir / 'model'}", flush=True)
            else:
                shutil.rmtree(tmp_dir, ignore_errors=True)
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
