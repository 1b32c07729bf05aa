"""``TrainerConfig``: every knob of ``PolicyTrainer``, validated in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError
from agentrl.trainer.losses import LOSS_AGG_MODES, DEFAULT_CHUNK_TOKENS, LossAggMode

DTYPES = ("float32", "bfloat16")
DEVICES = ("cpu", "cuda")


@dataclass
class TrainerConfig:
    """Configuration of ``PolicyTrainer``. Call ``validate()`` (the trainer does) to get a
    ``ConfigError`` naming any bad value."""

    model_path: str
    """Folder of a Hugging Face causal LM (``config.json`` + weights), loaded with
    ``AutoModelForCausalLM.from_pretrained``. Tokenizer files in it are copied by
    ``save_hf``."""

    dtype: str = "float32"
    """Compute dtype: ``"float32"`` (default; exact on CPU, and what the invariant tests
    use) or ``"bfloat16"``. Parameters and optimizer state are always kept in fp32; with
    ``"bfloat16"`` FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``
    casts the all-gathered weights for forward/backward and reduces gradients in fp32."""

    device: str = "cpu"
    """``"cpu"`` (process group backend gloo) or ``"cuda"`` (nccl). On CUDA the trainer
    uses device ``LOCAL_RANK`` (env), else ``rank % device_count``."""

    attn_implementation: str = "sdpa"
    """Attention kernel passed to ``from_pretrained`` (``"sdpa"``, ``"eager"``,
    ``"flash_attention_2"`` where installed). Rows are right-padded inside a micro-batch
    with an attention mask, which every listed kernel supports."""

    lr: float = 1e-6
    """AdamW peak learning rate. 1e-6 is the usual order for RL on instruct LLMs
    (GRPO/DAPO recipes use 1e-6 to 3e-6); larger values destabilise the policy fast."""

    weight_decay: float = 0.0
    """AdamW decoupled weight decay (applied to every parameter). 0 as in TRL's GRPO
    defaults: RL runs are short and start from a pretrained model."""

    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW ``(beta1, beta2)``, PyTorch defaults."""

    eps: float = 1e-8
    """AdamW epsilon, PyTorch default."""

    max_grad_norm: float | None = 1.0
    """Clip the global gradient L2 norm (over all ranks' shards) to this value; ``None``
    disables clipping (the norm is still reported as ``train/grad_norm``). A step whose
    gradient norm is not finite is skipped (``train/skipped_step`` = 1)."""

    warmup_steps: int = 0
    """Linear warmup over this many optimizer steps, then constant: the learning-rate
    factor of optimizer step ``k`` (0-based) is ``min(1, (k + 1) / warmup_steps)``."""

    micro_batch_size: int = 4
    """Rows per forward/backward pass on one rank (gradient accumulation over the rest).
    Does not change the result (the loss uses global token counts), only memory/speed."""

    micro_batch_tokens: int | None = None
    """Optional extra cap on the padded size (rows x longest row) of a micro-batch; a
    single row longer than the cap still runs alone. ``None``: no cap."""

    ppo_epochs: int = 1
    """Passes over each batch per ``step()``; each pass is one optimizer step. With 1 the
    update is on-policy (ratio 1 at the first pass), as in GRPO."""

    clip_ratio_low: float = 0.2
    """PPO clip range below 1: ratio clipped at ``1 - clip_ratio_low`` (Schulman 2017)."""

    clip_ratio_high: float = 0.2
    """PPO clip range above 1. DAPO's clip-higher uses 0.28 (Yu et al. 2025, Sec. 3.1)."""

    loss_agg_mode: LossAggMode = "token-mean"
    """``"token-mean"`` (every loss token of the batch weighs the same; DAPO Sec. 3.3),
    ``"seq-mean-token-mean"`` (GRPO's original per-sequence mean) or
    ``"seq-mean-token-sum"``. The normaliser is always the global count of the batch."""

    temperature: float | None = None
    """``None`` (recommended): score each batch at the temperature it records
    (``batch.sampling.temperature``). A float: the temperature the rollout is expected to
    use; a batch sampled at another one raises ``ConfigError`` instead of being trained."""

    logprob_chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    """Tokens per chunk when turning logits into log-probs / entropies (bounds the extra
    ``[chunk, vocab]`` fp32 memory; see ``agentrl.trainer.losses``)."""

    seed: int = 0
    """Seeds torch, numpy and ``random`` at construction (same seed on every rank)."""

    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (HF
    ``gradient_checkpointing_enable``, non-reentrant): less memory, about 30% more time.
    Gradients are the same up to float rounding."""

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the first invalid field."""
        validate_optim_fields(self)
        if not (isinstance(self.ppo_epochs, int) and self.ppo_epochs >= 1):
            raise ConfigError(f"ppo_epochs={self.ppo_epochs!r}; expected an int >= 1")
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise ConfigError(f"clip_ratio_low={self.clip_ratio_low}; expected 0 <= value < 1")
        if not self.clip_ratio_high >= 0.0:
            raise ConfigError(f"clip_ratio_high={self.clip_ratio_high}; expected >= 0")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ConfigError(f"loss_agg_mode={self.loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")
        if self.temperature is not None and not (0.0 < self.temperature < float("inf")):
            raise ConfigError(f"temperature={self.temperature}; expected a finite float > 0 or None")
        if not (isinstance(self.logprob_chunk_tokens, int) and self.logprob_chunk_tokens >= 1):
            raise ConfigError(f"logprob_chunk_tokens={self.logprob_chunk_tokens!r}; expected an int >= 1")


def validate_optim_fields(cfg: Any) -> None:
    """The checks the policy's ``TrainerConfig`` and the critic's ``CriticConfig`` share:
    model path, dtype, device, AdamW settings, warmup, micro-batching and seed.

    Raises:
        ConfigError: naming the first invalid field, its value and what was expected.
    """
    if not isinstance(cfg.model_path, str) or not cfg.model_path:
        raise ConfigError(f"model_path={cfg.model_path!r}; expected a model folder path")
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"dtype={cfg.dtype!r}; expected one of {DTYPES}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"device={cfg.device!r}; expected one of {DEVICES}")
    if not cfg.lr > 0:
        raise ConfigError(f"lr={cfg.lr}; expected > 0")
    if not cfg.weight_decay >= 0:
        raise ConfigError(f"weight_decay={cfg.weight_decay}; expected >= 0")
    if len(cfg.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.betas):
        raise ConfigError(f"betas={cfg.betas}; expected two values in [0, 1)")
    if not cfg.eps > 0:
        raise ConfigError(f"eps={cfg.eps}; expected > 0")
    if cfg.max_grad_norm is not None and not cfg.max_grad_norm > 0:
        raise ConfigError(f"max_grad_norm={cfg.max_grad_norm}; expected > 0 or None")
    if not (isinstance(cfg.warmup_steps, int) and cfg.warmup_steps >= 0):
        raise ConfigError(f"warmup_steps={cfg.warmup_steps!r}; expected an int >= 0")
    if not (isinstance(cfg.micro_batch_size, int) and cfg.micro_batch_size >= 1):
        raise ConfigError(f"micro_batch_size={cfg.micro_batch_size!r}; expected an int >= 1")
    if cfg.micro_batch_tokens is not None and not (isinstance(cfg.micro_batch_tokens, int) and cfg.micro_batch_tokens >= 1):
        raise ConfigError(f"micro_batch_tokens={cfg.micro_batch_tokens!r}; expected an int >= 1 or None")
    if not isinstance(cfg.seed, int):
        raise ConfigError(f"seed={cfg.seed!r}; expected an int")
