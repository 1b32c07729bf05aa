"""The trainers' configuration dataclasses, validated in one place.

``OptimConfig`` holds what both trainers share (model folder, dtype, device, AdamW,
warmup, clipping, micro-batching, seed, gradient checkpointing); ``TrainerConfig`` adds
the policy's PPO knobs, row layout, ``RolloutCorrectionConfig`` and ``KLConfig``;
``CriticConfig`` the value model's. Each ``validate()`` raises a ``ConfigError`` naming
the first bad field, its value and what was expected. ``RolloutCorrectionConfig``
(``agentrl.trainer.correction_config``) and ``KLConfig`` (``agentrl.trainer.kl_config``)
live beside the code that applies them and are re-exported here, with their names.

Each field's documentation is written once, in its dataclass, as ``metadata["doc"]``
(``agentrl.trainer.documented``: ``documented``, read by ``field_doc``). Each choice is one ``Literal`` (its tuple of names is
``typing.get_args`` of it). The run configuration's ``trainer`` / ``critic`` sections are
built from these fields (type, default and description), so the two layers say the same
thing.

These modules import no torch (only ``agentrl.errors``), so the run configuration
(``agentrl.config``) can build and check these without loading the trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from agentrl.errors import ConfigError
from agentrl.trainer.correction_config import (
    IS_LEVELS,
    ISLevel,
    RolloutCorrectionConfig,
)
from agentrl.trainer.documented import documented, field_doc
from agentrl.trainer.kl_config import (
    KL_DEFAULT_ESTIMATORS,
    KL_ESTIMATORS,
    KL_MODES,
    KLConfig,
    KLEstimator,
    KLMode,
)

__all__ = [
    "ATTENTION_WIDTH_GRAD_TOL", "ATTENTION_WIDTH_LOG_PROB_TOL", "ATTN_DEFAULT", "DEFAULT_CHUNK_TOKENS", "DEVICES",
    "DTYPES", "HF_ATTN_IMPLEMENTATIONS", "IS_LEVELS", "KL_DEFAULT_ESTIMATORS", "KL_ESTIMATORS", "KL_MODES",
    "LOSS_AGG_MODES", "PACKING_MODES", "POLICY_ATTN_IMPLEMENTATIONS", "VARLEN_SDPA", "CriticConfig", "DType",
    "Device", "HFAttnImplementation", "ISLevel", "KLConfig", "KLEstimator", "KLMode", "LossAggMode", "OptimConfig",
    "PackingMode", "PolicyAttnImplementation", "RolloutCorrectionConfig", "TrainerConfig", "documented", "field_doc",
    "validate_clip_ratios", "validate_dual_clip_c", "validate_optim_fields",
]

DType = Literal["float32", "bfloat16"]
"""Compute dtype of a trainer (``OptimConfig.dtype``)."""
DTYPES: tuple[str, ...] = get_args(DType)

Device = Literal["cpu", "cuda"]
"""Where a trainer computes (``OptimConfig.device``)."""
DEVICES: tuple[str, ...] = get_args(Device)

LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
"""How per-token losses are aggregated over the global batch (``aggregate_loss``)."""
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)

DEFAULT_CHUNK_TOKENS = 1024
"""Rows of logits processed at once by the chunked functions of ``agentrl.trainer.losses``
(1024 x 49,152 x 4 B = 201 MB)."""
PackingMode = Literal["packed", "padded"]
"""How the rows of a micro-batch are laid out for the forward pass (the config key
``trainer.row_layout``; ``agentrl.trainer.packing``)."""
PACKING_MODES: tuple[str, ...] = get_args(PackingMode)

ATTENTION_WIDTH_LOG_PROB_TOL = 1e-4
"""Bound (nats, absolute, fp32) on how far a row's log-probs move when its attention runs
inside a wider call than the row: padded rows through ``sdpa`` or ``eager``, or packed rows
through a kernel without a variable-length path (a dense block-diagonal mask). Stated for
rows of up to about 1,040 tokens (SmolLM2-135M-Instruct, fp32, CPU), the lengths it was
measured on: the error grows with row length, so longer rows (or deeper models) may exceed
it. PyTorch's CPU attention kernels block their sums by the call's length (the flash
kernel's query and key blocks follow the sequence length and each query block's causal end;
``eager``'s softmax and matmul reduce over the full width), so the row's sums round in
another order. Measured on SmolLM2-135M-Instruct, fp32, CPU, rows of 560-1,040 tokens
(random ids, log-probs down to -27): at most 1.7e-5 (padded, ``sdpa``), 5.0e-5 (padded,
``eager``), 7.1e-5 (packed, ``sdpa``, four rows in one sequence); it grows with row length
and depth. The default kernel off CUDA-bf16 (``auto`` = ``agentrl_varlen_sdpa``) runs each
row at its own length and is exact in both layouts (flash attention's varlen path, ``auto``
on CUDA in bf16, also runs rows at their own lengths; not measured here). Kept by
``tests/invariants/test_layouts_at_real_lengths.py``."""

ATTENTION_WIDTH_GRAD_TOL = 1e-5
"""Bound (absolute, fp32) on the parameter gradients' difference in the same cases as
``ATTENTION_WIDTH_LOG_PROB_TOL`` and for the same row lengths (up to about 1,040 tokens,
SmolLM2, fp32, CPU): measured at most 6.3e-7 (padded, ``sdpa``), 2.7e-6 (padded, ``eager``)
and 2.9e-6 (packed, ``sdpa``) on two SmolLM2 rows of 563 and 1,037 tokens. The default
kernel's gradients differ from a plain forward's by at most 2.7e-7 there (the weight
gradients of padded rows sum over more, zero, positions; the LM head's backward is written
out)."""

VARLEN_SDPA = "agentrl_varlen_sdpa"
"""Our variable-length attention kernel (``agentrl.trainer.attention``), by the name it is
registered under with transformers' ``AttentionInterface``."""

HFAttnImplementation = Literal["sdpa", "eager", "flash_attention_2"]
"""The Hugging Face attention kernels, the values ``CriticConfig.attn_implementation`` takes."""
HF_ATTN_IMPLEMENTATIONS: tuple[str, ...] = get_args(HFAttnImplementation)

PolicyAttnImplementation = Literal["auto", "sdpa", "eager", "flash_attention_2", "agentrl_varlen_sdpa"]
"""Accepted values of ``TrainerConfig.attn_implementation``: the Hugging Face kernels, ours
(``VARLEN_SDPA``) and ``"auto"``."""
POLICY_ATTN_IMPLEMENTATIONS: tuple[str, ...] = get_args(PolicyAttnImplementation)

ATTN_DEFAULT = "auto"
"""Default of ``TrainerConfig.attn_implementation`` (resolved by
``agentrl.trainer.attention.resolve_attn_implementation`` when the model loads)."""

def validate_clip_ratios(clip_ratio_low: float | None = None, clip_ratio_high: float | None = None) -> None:
    """The one check of the PPO clip range ``[1 - low, 1 + high]``, used by
    ``TrainerConfig.validate``, ``ppo_loss`` and the run config's ``trainer`` section
    (which checks each field on its own; ``None`` skips that side).

    Raises:
        ConfigError: ``clip_ratio_low`` outside ``[0, 1)`` or ``clip_ratio_high < 0``.
    """
    if clip_ratio_low is not None and not 0.0 <= clip_ratio_low < 1.0:
        raise ConfigError(f"clip_ratio_low={clip_ratio_low}; expected 0 <= value < 1")
    if clip_ratio_high is not None and not clip_ratio_high >= 0.0:
        raise ConfigError(f"clip_ratio_high={clip_ratio_high}; expected >= 0")


def validate_dual_clip_c(dual_clip_c: float | None, name: str = "dual_clip_c") -> None:
    """The check of the PPO dual-clip constant (Ye et al. 2020, Eq. 5), used by
    ``TrainerConfig.validate`` and ``ppo_loss``: ``None`` (off) or a finite ``c > 1`` (at
    ``c <= 1`` the bound ``-c A`` would cut tokens inside the ordinary clip range).

    Raises:
        ConfigError: naming the value.
    """
    if dual_clip_c is None:
        return
    c = dual_clip_c
    if not (isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 1.0):
        raise ConfigError(f"{name}={c!r}; expected a finite number > 1, or None (dual clip off)")


@dataclass
class OptimConfig:
    """What ``PolicyTrainer`` and ``CriticTrainer`` share: the model they load and how
    they optimise it. Used through ``TrainerConfig`` and ``CriticConfig``. Each field's
    documentation is its ``metadata["doc"]`` (``field_doc``), also shown by the run
    configuration."""

    model_path: str = documented(
        doc=(
            "Folder of a Hugging Face model (config.json + weights), loaded with from_pretrained: "
            "AutoModelForCausalLM for the policy; AutoModel for the critic (by default the policy's base model; "
            "a causal-LM checkpoint loads, its lm_head unused). Tokenizer files in it are copied by "
            "PolicyTrainer.save_hf."
        )
    )
    dtype: DType = documented(
        "float32",
        doc=(
            "Compute dtype: 'float32' (default; exact on CPU, and what the invariant tests use) or 'bfloat16'. "
            "Parameters and optimizer state are always kept in fp32; with 'bfloat16' FSDP2's "
            "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) casts the all-gathered weights for "
            "forward/backward and reduces gradients in fp32."
        ),
    )
    device: Device = documented(
        "cpu",
        doc=(
            "'cpu' (process group backend gloo) or 'cuda' (nccl). On CUDA the trainer uses device LOCAL_RANK "
            "(env), else rank % device_count."
        ),
    )
    attn_implementation: HFAttnImplementation = documented(
        "sdpa",
        doc=(
            "Attention kernel passed to from_pretrained: 'sdpa' (default), 'eager', or 'flash_attention_2' where "
            "installed. Rows are right-padded inside a micro-batch with an attention mask, which every listed "
            "kernel supports."
        ),
    )
    lr: float = documented(
        1e-6,
        doc=(
            "AdamW peak learning rate. 1e-6 is the usual order for RL on instruct LLMs (GRPO/DAPO recipes use "
            "1e-6 to 3e-6); larger values destabilise the policy fast."
        ),
    )
    weight_decay: float = documented(
        0.0,
        doc=(
            "AdamW decoupled weight decay (applied to every parameter). 0 as in TRL's GRPO defaults: RL runs "
            "are short and start from a pretrained model."
        ),
    )
    betas: tuple[float, float] = documented(
        (0.9, 0.999),
        doc=(
            "AdamW (beta1, beta2), the PyTorch defaults: decay rates of the running mean of the gradient and of "
            "its square. A lower beta2 (e.g. 0.95, common in LLM pretraining) adapts faster to the changing "
            "gradient scale of RL updates."
        ),
    )
    eps: float = documented(
        1e-8,
        doc="AdamW epsilon added to the root of the second moment, the PyTorch default; guards the step size where gradients are near zero.",
    )
    max_grad_norm: float | None = documented(
        1.0,
        doc=(
            "Clip the global gradient L2 norm (over all ranks' shards) to this value; None disables clipping "
            "(the norm is still reported). A step whose gradient norm is not finite is skipped (and counted)."
        ),
    )
    warmup_steps: int = documented(
        0,
        doc=(
            "Linear learning-rate warm-up over this many optimizer steps, then constant: the factor of optimizer "
            "step k (0-based) is min(1, (k + 1) / warmup_steps)."
        ),
    )
    micro_batch_size: int = documented(
        4,
        doc=(
            "Rows per forward/backward pass on one rank (gradient accumulation over the rest). Does not change "
            "the result (the loss uses global counts), only memory and speed."
        ),
    )
    micro_batch_tokens: int | None = documented(
        None,
        doc=(
            "Optional extra cap on the padded size (rows x longest row) of a micro-batch, for long rows; a single "
            "row longer than the cap still runs alone. None: no cap."
        ),
    )
    seed: int = documented(
        0,
        doc=(
            "Seeds torch, numpy and random at construction (same seed on every rank; the critic's head "
            "initialisation uses it)."
        ),
    )
    gradient_checkpointing: bool = documented(
        False,
        doc=(
            "Recompute each decoder layer's activations in backward (HF gradient_checkpointing_enable, "
            "non-reentrant): less memory, about 30% more time. Gradients are the same up to float rounding."
        ),
    )

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the first invalid shared field."""
        validate_optim_fields(self)


def validate_optim_fields(cfg: OptimConfig, attn_implementations: tuple[str, ...] = HF_ATTN_IMPLEMENTATIONS) -> None:
    """The checks of ``OptimConfig``'s fields: model path, dtype, device, attention kernel,
    AdamW settings, warmup, micro-batching and seed.

    Args:
        cfg: the config to check.
        attn_implementations: the kernels this trainer accepts (the policy's also take
            ``"auto"`` and ``VARLEN_SDPA``).

    Raises:
        ConfigError: naming the first invalid field, its value and what was expected.
    """
    if not isinstance(cfg.model_path, str) or not cfg.model_path:
        raise ConfigError(f"model_path={cfg.model_path!r}; expected a model folder path")
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"dtype={cfg.dtype!r}; expected one of {DTYPES}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"device={cfg.device!r}; expected one of {DEVICES}")
    if cfg.attn_implementation not in attn_implementations:
        raise ConfigError(f"attn_implementation={cfg.attn_implementation!r}; expected one of {attn_implementations}")
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


@dataclass
class TrainerConfig(OptimConfig):
    """Configuration of ``PolicyTrainer``: the shared ``OptimConfig`` fields plus the PPO,
    row-layout, rollout-correction and KL knobs below. Call ``validate()`` (the trainer
    does) to get a ``ConfigError`` naming any bad value."""

    attn_implementation: PolicyAttnImplementation = documented(
        ATTN_DEFAULT,
        doc=(
            "Attention kernel. 'auto' (default): flash_attention_2 on CUDA when the flash_attn package is installed and "
            "dtype is bfloat16 (it has no fp32 kernel), else agentrl_varlen_sdpa, our variable-length kernel "
            "that runs anywhere PyTorch does (SDPA once per row: no FLOP on padding or across rows). 'sdpa', "
            "'eager', 'flash_attention_2' and 'agentrl_varlen_sdpa' name one kernel. agentrl_varlen_sdpa runs "
            "every row, packed or padded, at its own length and scores it exactly as a plain forward of the row "
            "alone. 'sdpa' and 'eager' attend over the micro-batch's width (padded rows with a mask, packed rows "
            "with a block-diagonal mask) and are exact only up to rounding: log-probs within 1e-4, gradients "
            "within 1e-5 in fp32 on rows of up to about 1,040 tokens, the lengths measured (the error grows with "
            "row length; ATTENTION_WIDTH_LOG_PROB_TOL, ATTENTION_WIDTH_GRAD_TOL)."
        ),
    )
    micro_batch_size: int = documented(
        4,
        doc=(
            "padded layout: rows per forward/backward pass on one rank (gradient accumulation over the rest). "
            "packed layout: not used, micro_batch_tokens bounds a micro-batch. Only memory and speed depend on "
            "it (the loss uses global counts), except that with 'sdpa' or 'eager' a micro-batch's width moves the "
            "scores within ATTENTION_WIDTH_LOG_PROB_TOL (see attn_implementation)."
        ),
    )
    micro_batch_tokens: int | None = documented(
        8192,
        doc=(
            "packed layout: the token budget of a micro-batch; rows are bin-packed (first-fit decreasing) into "
            "micro-batches of at most this many tokens, and a longer row runs alone (None: 8192). padded layout: "
            "an optional cap on rows x longest row of a micro-batch (None: no cap). Only memory and speed depend "
            "on it (the loss uses global counts), except that with 'sdpa' or 'eager' a micro-batch's width moves "
            "the scores within ATTENTION_WIDTH_LOG_PROB_TOL (see attn_implementation). A larger budget means "
            "fewer passes but more activation memory (about 1.7 MB per token for SmolLM2-135M in fp32): on 2 "
            "CPU cores 1536 was as fast as 8192 and its update peaked at 5.6 GB instead of 15 GB "
            "(tests/benchmarks/bench_trainer.py); on a GPU, larger budgets fill the device better."
        ),
    )
    ppo_epochs: int = documented(
        1,
        doc=(
            "Passes over each batch per step(); each pass is one optimizer step. With 1 the update is on-policy "
            "(ratio 1 at the first pass), as in GRPO."
        ),
    )
    clip_ratio_low: float = documented(
        0.2,
        doc="PPO clip range below 1: the ratio is clipped at 1 - clip_ratio_low, in [0, 1) (Schulman et al. 2017).",
    )
    clip_ratio_high: float = documented(
        0.2,
        doc="PPO clip range above 1: the ratio is clipped at 1 + clip_ratio_high, >= 0. DAPO's clip-higher uses 0.28 (Yu et al. 2025, Sec. 3.1).",
    )
    dual_clip_c: float | None = documented(
        3.0,
        doc=(
            "PPO dual clip (Ye et al. 2020, Eq. 5): for a negative advantage the per-token loss is bounded by "
            "c * |A|, so a token whose ratio has grown far beyond the clip range (stale or off-policy samples) "
            "cannot dominate the step. Must be > 1; None: off. Inactive while every ratio stays below c (always "
            "so with ppo_epochs 1 and on-policy data)."
        ),
    )
    loss_agg_mode: LossAggMode = documented(
        "token-mean",
        doc=(
            "Loss aggregation over the global batch: 'token-mean' (every loss token of the batch weighs the "
            "same; DAPO Sec. 3.3), 'seq-mean-token-mean' (GRPO's original per-sequence mean) or "
            "'seq-mean-token-sum'. The normaliser is always the global count of the batch."
        ),
    )
    temperature: float | None = documented(
        None,
        doc=(
            "None (recommended): score each batch at the temperature it records (batch.sampling.temperature). "
            "A float: the temperature the rollout is expected to use; a batch sampled at another one raises "
            "ConfigError instead of being trained."
        ),
    )
    row_layout: PackingMode = documented(
        "packed",
        doc=(
            "'packed' (default): a micro-batch's rows are concatenated into one sequence without padding, "
            "attention restricted to each row and position ids restarting per row; micro-batches formed by the "
            "micro_batch_tokens budget. 'padded': rows right-padded to the longest row of the micro-batch "
            "(micro_batch_size rows each), for comparison and for kernels without variable-length attention. "
            "With agentrl_varlen_sdpa (what 'auto' picks off CUDA-bf16) both give a plain forward's log-probs bit "
            "for bit and its gradients within 1e-6 (fp32, CPU); with 'sdpa' or 'eager' the log-probs are within "
            "1e-4 and the gradients within 1e-5 (see attn_implementation). Packed spends no compute on padding."
        ),
    )
    logprob_chunk_tokens: int = documented(
        DEFAULT_CHUNK_TOKENS,
        doc=(
            "Positions projected to the vocabulary at once when scoring log-probs, entropies and KL: bounds the "
            "extra memory of the log-prob step to about chunk x vocabulary x 4 bytes times a small constant "
            "(1024 x 49,152 x 4 B = 201 MB for SmolLM2). Smaller saves memory, larger saves a little time."
        ),
    )
    rollout_correction: RolloutCorrectionConfig = documented(
        default_factory=RolloutCorrectionConfig,
        doc=(
            "Correction of the mismatch between the engine's log-probs (behavior) and the trainer's at the "
            "weights the update starts from (proximal): importance weights and masks of the policy-gradient "
            "term (decoupled PPO). Off by default; see its fields."
        ),
    )
    kl: KLConfig = documented(
        default_factory=KLConfig,
        doc="KL penalty toward a frozen reference policy, in the loss or in the reward. Off by default (coef 0); see its fields.",
    )

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the first invalid field."""
        validate_optim_fields(self, POLICY_ATTN_IMPLEMENTATIONS)
        if not (isinstance(self.ppo_epochs, int) and self.ppo_epochs >= 1):
            raise ConfigError(f"ppo_epochs={self.ppo_epochs!r}; expected an int >= 1")
        validate_clip_ratios(self.clip_ratio_low, self.clip_ratio_high)
        validate_dual_clip_c(self.dual_clip_c)
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ConfigError(f"loss_agg_mode={self.loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")
        if self.temperature is not None and not (0.0 < self.temperature < float("inf")):
            raise ConfigError(f"temperature={self.temperature}; expected a finite float > 0 or None")
        if self.attn_implementation == "flash_attention_2" and (self.device != "cuda" or self.dtype != "bfloat16"):
            raise ConfigError(
                f"attn_implementation='flash_attention_2' with device={self.device!r}, dtype={self.dtype!r}; flash "
                "attention needs device 'cuda' and dtype 'bfloat16' (no CPU or fp32 kernel); 'auto' picks it where "
                "it can run"
            )
        if self.row_layout not in PACKING_MODES:
            raise ConfigError(f"row_layout={self.row_layout!r}; expected one of {PACKING_MODES}")
        if not (isinstance(self.logprob_chunk_tokens, int) and self.logprob_chunk_tokens >= 1):
            raise ConfigError(f"logprob_chunk_tokens={self.logprob_chunk_tokens!r}; expected an int >= 1")
        if not isinstance(self.rollout_correction, RolloutCorrectionConfig):
            raise ConfigError(f"rollout_correction={self.rollout_correction!r}; expected a RolloutCorrectionConfig")
        self.rollout_correction.validate()
        if not isinstance(self.kl, KLConfig):
            raise ConfigError(f"kl={self.kl!r}; expected a KLConfig")
        self.kl.validate()


@dataclass
class CriticConfig(OptimConfig):
    """Configuration of ``CriticTrainer``: the shared ``OptimConfig`` fields (its
    ``model_path`` is the backbone, loaded with ``AutoModel``) plus the value-model knobs
    below. ``validate()`` (the trainer calls it) raises a ``ConfigError`` naming any bad
    value."""

    lr: float = documented(
        1e-5,
        doc=(
            "AdamW peak learning rate of the critic. Critics usually learn about 10x faster than the policy "
            "(verl's critic default 1e-5 vs actor 1e-6)."
        ),
    )
    head_init_std: float = documented(
        0.0,
        doc=(
            "Std of the value head's initial weight; 0 (default) zeroes it, so a fresh critic predicts 0 "
            "everywhere (see TurnValueModel)."
        ),
    )
    value_clip: float | None = documented(
        None,
        doc=(
            "PPO value clipping range eps_v (None: plain MSE). With it the per-position loss is "
            "0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2) (PPO2 / CleanRL clip_vloss; "
            "verl's cliprange_value defaults to 0.5). V_old is ValueBatch.old_values or, when absent, the values "
            "of this step's first epoch (then clipping only acts from the second epoch on). Returns in reward "
            "units."
        ),
    )
    epochs: int = documented(
        1,
        doc="Optimizer steps (passes over the batch) of the critic per step(), i.e. per iteration.",
    )

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the first invalid field."""
        validate_optim_fields(self)
        if not (isinstance(self.head_init_std, (int, float)) and math.isfinite(self.head_init_std) and self.head_init_std >= 0):
            raise ConfigError(f"head_init_std={self.head_init_std!r}; expected a finite number >= 0")
        if self.value_clip is not None and not (math.isfinite(self.value_clip) and self.value_clip > 0):
            raise ConfigError(f"value_clip={self.value_clip!r}; expected a finite number > 0 or None")
        if not (isinstance(self.epochs, int) and self.epochs >= 1):
            raise ConfigError(f"epochs={self.epochs!r}; expected an int >= 1")
