"""The run configuration: pydantic models, loaded from YAML plus ``key=value`` overrides.

Every field carries its default and why. Validation happens here, in one place, and a bad
key or value raises ``ConfigError`` naming the key, the value and what was expected. The
``trainer`` and ``critic`` sections mirror the trainers' dataclasses
(``agentrl.trainer.config``): their defaults and descriptions are read from those fields,
and the dataclasses' own ``validate()`` checks them at start-up.

Example::

    cfg = load_config("examples/humaneval.yaml", ["rollout.max_turns=2", "run.iterations=5"])
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Literal, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

import agentrl.trainer.config as _tc
from agentrl.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(_Section):
    name: str = Field("humaneval-smollm2", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}$",
                      description="Run name (letters, digits, '_', '.', '-'); the run directory is output_dir/name unless run.dir is set. It also labels the run's sandboxes.")
    output_dir: str = Field("runs", description="Parent directory of run directories.")
    dir: str | None = Field(None, description="Explicit run directory (overrides output_dir/name).")
    seed: int = Field(0, description="Seed of task order, sampling and trainer init. Same seed, same run (CPU).")
    iterations: int = Field(3, ge=1, description="Number of rollout→update iterations to run in total (a resumed run continues up to this).")
    checkpoint_every: int = Field(1, ge=1, description="Save a checkpoint every N iterations (and always at the end).")


class ModelConfig(_Section):
    path: str = Field(
        "smollm2-135m-instruct",
        description="A short name that `agentrl models prepare` knows (smollm2-135m-instruct, tiny-random-smollm2), a local HF folder, or a hub id.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Engine and trainer dtype. float32 on CPU: a bf16 engine silently drops most of a small AdamW update (platform notes).",
    )


class EnvConfig(_Section):
    id: str = Field("agentrl/HumanEval-v0", description="Registered gymnasium id.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for gymnasium.make.")
    import_modules: list[str] = Field(default_factory=list, description="Modules that register environments when imported (yours, e.g. my_envs); imported in the driver and in every Ray actor. Installed packages can use the 'agentrl.environments' entry-point group instead.")
    split: str = Field("train", description="Task split the TaskSource draws from.")
    task_ids: list[str] | None = Field(None, description="Train on these task ids only (each must belong to the split); None: the whole split.")
    tasks_per_iteration: int = Field(4, ge=1, description="Distinct task instances (groups) per iteration.")
    group_size: int = Field(4, ge=1, description="Rollouts per task instance (GRPO group size).")
    difficulty_filter: Literal["off", "skip_solved_and_unsolved"] = Field(
        "off", description="Difficulty-aware task sampling (controller.mode sync): before iteration 0, and every profile_every iterations, the run's engines roll out every training task profile_samples times with the rollout's own sampling and limits; tasks whose pass rate is 0 or 1 under that policy version with every sample's reward equal (a group with no reward variance, no gradient; a partial-credit reward that differs keeps a task) are skipped until the next profile. The profiling tokens count in tokens/generated (and tokens/discarded). When every task would be skipped, the run trains on all of them (a warning, profile/fallback_all 1). off: the task order is exactly the unfiltered one.")
    profile_samples: int = Field(4, ge=2, description="Samples per task in a difficulty profile (n; errored samples are left out of n). At least 2: with 1 every pass rate is 0 or 1.")
    profile_every: int = Field(0, ge=0, description="Re-profile the tasks before every N-th iteration (iterations 0, N, 2N ...) with the policy of that moment; 0: once, before iteration 0.")


class RolloutConfig(_Section):
    max_turns: int = Field(3, ge=1, description="Hard cap on agent turns per episode (termination reason max_turns).")
    max_new_tokens: int = Field(256, ge=1, description="Per-turn completion cap; hitting it ends the episode as truncated, reason 'length'.")
    max_context_tokens: int = Field(2048, ge=16, description="Whole-episode token budget; a turn that cannot fit ends the episode (context_limit) without an engine call.")
    prompt_mode: Literal["full_history", "per_step"] = Field(
        "full_history",
        description="full_history: the conversation grows turn by turn (one training row per episode). per_step: each turn's prompt is the task, the last history_length steps and the current observation, so context stays flat over long episodes; each step is its own training row with its own anchor.",
    )
    history_length: int = Field(2, ge=0, description="per_step mode: how many previous (action, observation) steps the prompt shows.")
    score_truncated: bool = Field(True, description="Hand a completion cut by max_new_tokens to the environment for scoring (the episode still ends there, truncated); an unparseable cut answer earns 0 and is never counted as a format failure.")
    stop_strings: list[str] = Field(
        default_factory=list,
        description="Strings that end a turn, e.g. ['</tool_call>']: the turn ends with the token that completes the first one in its text (what the model writes after it is not kept), the environment acts on it, and the next prompt closes the message with the chat template's end-of-message text (not sampled, loss_mask 0). Stops a model that writes a tool call and then imagines its output. One inside a JSON string of an open <tool_call> (an argument such as \"grep '</tool_call>' notes.md\") does not end the turn. Empty: turns end at a stop token or max_new_tokens only.",
    )
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature; the trainer scores at the same temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling. The trainer refuses top_p < 1 (it cannot reproduce it exactly).")
    top_k: int = Field(-1, description="Top-k sampling (-1 = off). The trainer refuses top_k > 0.")
    kv_cache_gb: float = Field(1.0, gt=0.0, description="vLLM CPU KV cache size (VLLM_CPU_KVCACHE_SPACE), GiB.")
    max_num_seqs: int = Field(64, ge=1, description="vLLM's concurrent sequence cap.")
    env_workers: int = Field(8, ge=1, description="Threads running environment steps (sandbox execs) while the engine keeps generating.")
    env_timeout_s: float | None = Field(
        600.0, gt=0.0, le=86_400.0,
        description="Seconds one environment call may run (a reset, with making the env and its sandbox, or a step, "
                    "with its tool calls) before its episode ends as infra_error with an error naming the call and "
                    "the task; the others go on. The stuck call is left running in its thread (Python cannot stop "
                    "it); its env and sandbox are closed if it returns. null: no limit.",
    )
    num_engines: int = Field(
        1, ge=1,
        description="Rollout engines (Ray actors placed with cluster.placement.rollout), each a vLLM engine with "
                    "its agent loop and its sandboxes. Each iteration's episodes go to the least-loaded engine; a "
                    "group may span engines (grouping is by group_id, never by engine).",
    )
    check_template: bool = Field(True, description="At start-up, prove that turn-by-turn (delta) tokenization equals the full chat-template rendering; refuse to start otherwise. full_history only: per_step renders each step's whole prompt, so a template that cannot be extended turn by turn is fine there.")

    @model_validator(mode="after")
    def _check(self) -> "RolloutConfig":
        if self.max_new_tokens >= self.max_context_tokens:
            raise ValueError(
                f"rollout.max_new_tokens={self.max_new_tokens} must be smaller than rollout.max_context_tokens={self.max_context_tokens}"
            )
        if any(not s for s in self.stop_strings):
            raise ValueError(f"rollout.stop_strings={self.stop_strings!r} holds an empty string; expected non-empty strings "
                             "(an empty one would end every turn at its first token)")
        return self


class SandboxConfig(_Section):
    backend: Literal["auto", "docker", "bwrap"] = Field("auto", description=(
        "auto: Docker when a daemon of ours answers and has the image, else bubblewrap; decided once "
        "at the start of a run and printed in its first lines as 'sandboxes: ...'. Ours: the daemon "
        "sandbox.docker_host or DOCKER_HOST names (it must answer, else the run stops with an error "
        "naming it), else the dockerd agentrl's own scripts started (scripts/test.sh). Any other daemon, "
        "the one at /var/run/docker.sock included, may be another job's and is not used: the line says "
        "it answers and that sandbox.docker_host uses it. docker: the named daemon, else "
        "/var/run/docker.sock; it must answer."))
    docker_host: str | None = Field(None, pattern=r"^(unix|tcp|ssh|http|https)://\S+$", description=(
        "The Docker daemon the run uses, e.g. unix:///var/run/docker.sock or tcp://10.0.0.5:2375 (as "
        "DOCKER_HOST is written). Set, it wins over DOCKER_HOST (the config is the run's record); None: "
        "DOCKER_HOST when set. Used by the run's sandboxes, its image check and its reaper's container pass."))
    memory_mb: int = Field(1024, ge=16, description="Memory limit per sandbox, MiB.")
    cpus: float = Field(1.0, gt=0.0, description="CPU share per sandbox, cores.")
    pids_limit: int = Field(128, ge=8, description="Process limit per sandbox.")
    timeout_s: float = Field(10.0, gt=0.0, description="Default per-command timeout, seconds.")
    output_limit_bytes: int = Field(16 * 1024, ge=256, description="Cap per output stream of one command (head and tail kept).")
    pool_size: int = Field(0, ge=0, description="Warm sandboxes kept started ahead and handed out per episode (0: a fresh sandbox per episode, no pool); per rollout actor, or per sandbox host with cluster.sandbox_hosts > 0.")
    max_sandboxes: int | None = Field(None, ge=1, description="With a pool: cap on sandboxes alive at once (episodes wait for one); None: pool_size, or more when episodes need them.")
    between_episodes: Literal["reset", "replace"] = Field("reset", description="With a pool: empty a returned sandbox's work dir and /tmp (reset) or start a fresh one (replace).")


def _estimator(name: str):
    """The registration of ``name`` in ``critics``' estimator registry (imported here, on
    first use, so loading a config stays cheap). Raises ``ConfigError`` naming the
    registered ones."""
    from critics.registry import get_estimator

    return get_estimator(name)


class GiGPOSection(_Section):
    """``algorithm.gigpo``: GiGPO's own settings (Feng et al. 2025, "Group-in-Group Policy
    Optimization for LLM Agent Training", arXiv 2505.10978), read by ``algorithm.advantage:
    gigpo`` only (its discount is ``algorithm.gamma``). Per step ``t`` of trajectory ``i``:
    ``A(i, t) = A_E(i) + step_weight * A_S(i, t)`` (Eq. 8), with ``A_E = (R(i) - mean) / F``
    over the episode group (Eq. 3) and ``A_S = (R_t - mean) / F`` over the step group of the
    same anchor state (Eq. 7); ``critics.gigpo_advantages`` documents every case."""

    step_weight: float = Field(
        1.0, ge=0.0, allow_inf_nan=False,
        description="omega in Eq. 8, the weight of the step-level (anchor-state) advantage beside the episode-level "
                    "one: A = A_E + omega * A_S. 1.0 (the paper's and verl-agent's default); 0: the episode level "
                    "alone, every step of a trajectory gets its A_E.",
    )
    mode: Literal["mean_norm", "mean_std_norm"] = Field(
        "mean_norm",
        description="The normaliser F of both levels (Eq. 3 and 7): mean_norm, F = 1 (the mean is subtracted only; "
                    "verl-agent's default, Dr. GRPO's argument against the std); mean_std_norm, F = std + 1e-6 "
                    "(unbiased std of the group).",
    )
    episode_stats: Literal["trajectory", "step"] = Field(
        "trajectory",
        description="The samples of the episode-level mean and std (Eq. 3): trajectory, one per trajectory (the "
                    "paper); step, the trajectory's return once per step it took (verl-agent's "
                    "compute_mean_std_cross_steps), so longer trajectories weigh more.",
    )


class AlgorithmConfig(_Section):
    advantage: str = Field(
        "grpo",
        description="Advantage estimator, a name registered in critics' registry (yours too: register it in a module listed in env.import_modules, or through the 'agentrl.estimators' entry-point group). Built-ins: grpo (group mean/std), rloo (leave-one-out mean), drgrpo (no std), gigpo (episode + anchor-state step groups), turn_critic (a learned value per turn and turn-level GAE with gamma/lam per turn), gae (PPO with a token-level critic: a learned value per sampled token and token-level GAE with token_gamma/token_lam per sampled token, observation tokens skipped). turn_critic and gae train the critic section's value model.",
    )
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda per turn for turn_critic (turn-level GAE). Not used by gae, which has token_lam.")
    norm_by_std: bool = Field(True, description="grpo only: divide by the group's std (rloo and drgrpo never do).")
    gigpo: GiGPOSection = Field(default_factory=GiGPOSection, description="gigpo only: its step weight omega, normalisation mode and episode statistics (Feng et al. 2025, Eq. 3, 7, 8); see the section's fields.")
    gamma: float = Field(0.95, ge=0.0, le=1.0, description="Discount per step for gigpo and per turn for turn_critic. Not used by gae, whose discount acts per sampled token (token_gamma): 0.95 per token would scale a reward 100 tokens back by 0.95**100 = 0.006.")
    token_gamma: float = Field(1.0, ge=0.0, le=1.0, description="gae only: discount per sampled token (observation and prompt tokens are skipped, not discounted). 1.0, verl's token-level PPO default: the episode's rewards reach every earlier token of the episode undiscounted.")
    token_lam: float = Field(1.0, ge=0.0, le=1.0, description="gae only: GAE lambda per sampled token. 1.0 (verl's default): advantage = return - V, unbiased, the critic only as a baseline; lower values (e.g. 0.95) trust the critic's bootstrap more, with less variance and more bias.")
    dynamic_sampling: bool = Field(False, description="DAPO dynamic sampling: drop groups whose (shaped) rewards are all equal (their tokens are counted as discarded), and roll out further task groups to refill, up to max_refill_rounds.")
    max_refill_rounds: int = Field(2, ge=0, description="Dynamic sampling: at most this many extra rollout rounds per iteration to replace dropped groups.")
    invalid_action_penalty: float = Field(0.0, ge=0.0, description="Subtracted from the reward of the step whose action was invalid (that step only; the recorded env reward is unchanged).")
    overlong_buffer_tokens: int = Field(0, ge=0, description="DAPO soft overlong punishment (Eq. 13) per turn: 0 disables; else the last N tokens before rollout.max_new_tokens are penalised linearly down to -overlong_penalty.")
    overlong_penalty: float = Field(1.0, ge=0.0, description="Scale of the soft overlong punishment.")
    overlong_filtering: bool = Field(False, description="DAPO overlong filtering (Yu et al. 2025, §3.4), per turn: a completion cut by a token budget (finish_reason 'length': it hit rollout.max_new_tokens, episode termination 'length', or the room left in rollout.max_context_tokens, termination 'context_limit') is left out of the loss (loss_mask 0; its tokens counted as discarded). The episode's earlier turns keep their advantages and its reward still counts in its group's statistics, so a cut reply is neither reinforced nor blamed for its length.")
    error_policy: Literal["drop_episode", "drop_group"] = Field(
        "drop_episode",
        description="What an infra/reward error does to its group: drop only the errored episode (others keep group statistics over valid samples) or the whole group.",
    )

    @field_validator("advantage")
    @classmethod
    def _registered(cls, name: str) -> str:
        try:
            _estimator(name)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return name

    @property
    def uses_critic(self) -> bool:
        """True when the estimator is registered as needing a critic's values, so the
        critic section's value model is trained (built-ins: ``turn_critic``, one value per
        turn; ``gae``, one value per sampled token)."""
        return _estimator(self.advantage).needs_values


def _documented(cls: type, name: str, *, note: str = "", **constraints: Any) -> Any:
    """A pydantic ``Field`` with the default and the documentation of field ``name`` of the
    trainer dataclass ``cls`` (``agentrl.trainer.config``): one source for the text of both
    layers. ``note`` is appended for what only the run config adds."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    doc = _tc.field_doc(cls, name) + (f" {note}" if note else "")
    return Field(f.default, description=doc, **constraints)


def _as_value_error(check: Any, prefix: str) -> None:
    """Run a dataclass ``validate`` and turn its ``ConfigError`` into the ``ValueError``
    pydantic collects, with the run-config key prefix (``trainer.``) on the message."""
    try:
        check()
    except ConfigError as exc:
        raise ValueError(f"{prefix}{exc}") from None


class _DataclassSection(_Section):
    """A sub-section that is one trainer dataclass (``_dataclass``, every field of the same
    name), checked by that dataclass's ``validate`` with the run-config key ``_prefix``."""

    _dataclass: ClassVar[type]
    _prefix: ClassVar[str]

    def to_dataclass(self) -> Any:
        """This section as its ``agentrl.trainer.config`` dataclass."""
        return self._dataclass(**{name: getattr(self, name) for name in type(self).model_fields})

    @model_validator(mode="after")
    def _check(self) -> "_DataclassSection":
        _as_value_error(lambda: self.to_dataclass().validate(prefix=self._prefix), "")
        return self


class RolloutCorrectionSection(_DataclassSection):
    """``trainer.rollout_correction``: ``agentrl.trainer.config.RolloutCorrectionConfig``.
    Importance weights and masks need the engine's log-probs of the distribution the
    trainer recomputes, so they refuse top-p / top-k sampling (a start-up ``ConfigError``)."""

    _dataclass: ClassVar[type] = _tc.RolloutCorrectionConfig
    _prefix: ClassVar[str] = "trainer.rollout_correction."

    is_level: Literal["token", "sequence"] | None = _documented(_tc.RolloutCorrectionConfig, "is_level")
    is_cap: float = _documented(_tc.RolloutCorrectionConfig, "is_cap")
    token_mask_band: tuple[float, float] | None = _documented(_tc.RolloutCorrectionConfig, "token_mask_band")
    seq_mask_band: tuple[float, float] | None = _documented(_tc.RolloutCorrectionConfig, "seq_mask_band")


class KLSection(_DataclassSection):
    """``trainer.kl``: ``agentrl.trainer.config.KLConfig``, a KL penalty toward a frozen
    reference policy."""

    _dataclass: ClassVar[type] = _tc.KLConfig
    _prefix: ClassVar[str] = "trainer.kl."

    coef: float = _documented(_tc.KLConfig, "coef")
    mode: Literal["loss", "reward"] = _documented(_tc.KLConfig, "mode")
    estimator: Literal["k1", "k2", "k3"] | None = _documented(_tc.KLConfig, "estimator", validate_default=True)
    reference_path: str | None = _documented(_tc.KLConfig, "reference_path")

    @field_validator("estimator")
    @classmethod
    def _by_mode(cls, estimator: str | None, info: ValidationInfo) -> str | None:
        """``None`` becomes the mode's estimator (``KL_DEFAULT_ESTIMATORS``: k1 for
        ``reward``, k3 for ``loss``), so the validated section, a dump of it and the
        trainer's ``KLConfig`` all name the estimator in use. ``mode`` is declared first,
        so it is validated (and in ``info.data``) by now; a bad mode stays ``None`` here
        and is reported by its own field."""
        if estimator is None:
            return _tc.KL_DEFAULT_ESTIMATORS.get(info.data.get("mode", ""))
        return estimator


_TC, _CC = _tc.TrainerConfig, _tc.CriticConfig


class TrainerSection(_Section):
    """The policy trainer (``agentrl.trainer.TrainerConfig``, built by ``trainer_configs``)
    and where it runs. Every field but ``num_ranks`` and ``backend`` is the dataclass field
    of the same name, with its default and documentation; the dataclass's ``validate``
    checks them at start-up (``Config``'s cross-checks)."""

    lr: float = _documented(_TC, "lr", gt=0.0)
    weight_decay: float = _documented(_TC, "weight_decay", ge=0.0)
    betas: tuple[float, float] = _documented(_TC, "betas")
    eps: float = _documented(_TC, "eps", gt=0.0)
    max_grad_norm: float | None = _documented(_TC, "max_grad_norm", gt=0.0)
    warmup_steps: int = _documented(_TC, "warmup_steps", ge=0)
    ppo_epochs: int = _documented(_TC, "ppo_epochs", ge=1)
    clip_ratio_low: float = _documented(_TC, "clip_ratio_low")
    clip_ratio_high: float = _documented(_TC, "clip_ratio_high")
    dual_clip_c: float | None = _documented(_TC, "dual_clip_c")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = _documented(_TC, "loss_agg_mode")
    rollout_correction: RolloutCorrectionSection = Field(
        default_factory=RolloutCorrectionSection, description=_tc.field_doc(_TC, "rollout_correction")
    )
    kl: KLSection = Field(default_factory=KLSection, description=_tc.field_doc(_TC, "kl"))
    row_layout: Literal["packed", "padded"] = _documented(_TC, "row_layout")
    micro_batch_tokens: int | None = _documented(_TC, "micro_batch_tokens", ge=1)
    micro_batch_size: int = _documented(_TC, "micro_batch_size", ge=1)
    logprob_chunk_tokens: int = _documented(_TC, "logprob_chunk_tokens", ge=1)
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2", "agentrl_varlen_sdpa"] = _documented(
        _TC, "attn_implementation"
    )
    gradient_checkpointing: bool = _documented(_TC, "gradient_checkpointing")
    num_ranks: int = Field(1, ge=1, description="FSDP2 ranks (trainer actors). CPU default 1: the 2 cores are shared with the engine.")
    backend: Literal["gloo", "nccl"] = Field("gloo", description="torch.distributed backend: gloo on CPU, nccl on GPUs.")
    device: Literal["cpu", "cuda"] = _documented(_TC, "device", note="The critic runs on the same device.")


class CriticSection(_Section):
    """The value model, used when ``algorithm.advantage`` is ``turn_critic`` (a value per
    turn, read at the token before the turn's completion) or ``gae`` (a value per sampled
    token, read at the token before it). The same model and settings serve both
    (``agentrl.trainer.CriticConfig``, built by ``trainer_configs``); dtype, device and
    seed are the policy's. Every field but ``model_path`` is the dataclass field of the same
    name, with its default and documentation."""

    model_path: str | None = Field(None, description="Backbone of the value model (None: the policy's model, a scalar head on top).")
    lr: float = _documented(_CC, "lr", gt=0.0)
    weight_decay: float = _documented(_CC, "weight_decay", ge=0.0)
    betas: tuple[float, float] = _documented(_CC, "betas")
    eps: float = _documented(_CC, "eps", gt=0.0)
    max_grad_norm: float | None = _documented(_CC, "max_grad_norm", gt=0.0)
    warmup_steps: int = _documented(_CC, "warmup_steps", ge=0)
    epochs: int = _documented(_CC, "epochs", ge=1)
    value_clip: float | None = _documented(_CC, "value_clip", gt=0.0)
    head_init_std: float = _documented(_CC, "head_init_std", ge=0.0)
    micro_batch_size: int = _documented(_CC, "micro_batch_size", ge=1)
    micro_batch_tokens: int | None = _documented(_CC, "micro_batch_tokens", ge=1)
    gradient_checkpointing: bool = _documented(_CC, "gradient_checkpointing")


_SECTION_ONLY = {"trainer": ("num_ranks", "backend"), "critic": ("model_path",)}
"""Section fields that are not passed to the dataclass field of the same name:
``num_ranks`` / ``backend`` place the trainer; ``critic.model_path`` None means the
policy's model, resolved by ``trainer_configs``."""


def _dataclass_kwargs(section: BaseModel, skip: Sequence[str]) -> dict[str, Any]:
    """A section's fields by name (sub-sections as their dataclasses), minus ``skip``."""
    out = {}
    for name in type(section).model_fields:
        if name in skip:
            continue
        value = getattr(section, name)
        out[name] = value.to_dataclass() if hasattr(value, "to_dataclass") else value
    return out


def _policy_config(cfg: "Config", model_path: str) -> Any:
    common = {"dtype": cfg.model.dtype, "device": cfg.trainer.device, "seed": cfg.run.seed}
    kwargs = _dataclass_kwargs(cfg.trainer, _SECTION_ONLY["trainer"])
    kwargs.update(common)
    return _tc.TrainerConfig(model_path=model_path, **kwargs)


def _critic_config(cfg: "Config", model_path: str) -> Any:
    common = {"dtype": cfg.model.dtype, "device": cfg.trainer.device, "seed": cfg.run.seed}
    c = cfg.critic
    return _tc.CriticConfig(model_path=c.model_path or model_path, **_dataclass_kwargs(c, _SECTION_ONLY["critic"]), **common)


def _vocab_size(folder: str, what: str) -> int:
    """``vocab_size`` from a Hugging Face folder's ``config.json`` (top level, or its
    ``text_config`` for multimodal models)."""
    path = Path(folder) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what}={folder!r}: cannot read its config.json ({exc}); expected a Hugging Face model folder") from None
    size = data.get("vocab_size")
    if size is None and isinstance(data.get("text_config"), dict):
        size = data["text_config"].get("vocab_size")
    if not isinstance(size, int):
        raise ConfigError(f"{what}={folder!r}: config.json has no integer vocab_size (got {size!r})")
    return size


def check_reference_vocab(policy_path: str, reference_path: str) -> None:
    """Refuse a KL reference model whose vocabulary differs from the policy's: the
    per-token log-probs of the two would score different token ids.

    Compares ``vocab_size`` of both folders' ``config.json`` (the trainer also compares the
    loaded embedding sizes).

    Raises:
        ConfigError: naming both paths and both sizes, or a folder without a readable
            ``config.json``.
    """
    ref = _vocab_size(reference_path, "trainer.kl.reference_path")
    pol = _vocab_size(policy_path, "model.path")
    if ref != pol:
        raise ConfigError(
            f"trainer.kl.reference_path={reference_path!r} has vocab_size={ref} but the policy "
            f"(model.path resolved to {policy_path!r}) has vocab_size={pol}; the reference must share the policy's vocabulary"
        )


def trainer_configs(cfg: "Config", model_path: str) -> tuple[Any, Any]:
    """The one place the trainers' dataclasses are built from the run config.

    Every ``trainer`` field except ``num_ranks`` / ``backend`` and every ``critic`` field
    except ``model_path`` becomes the dataclass field of the same name (the sub-sections
    ``trainer.rollout_correction`` and ``trainer.kl`` as ``RolloutCorrectionConfig`` and
    ``KLConfig``).

    Args:
        cfg: the validated run config.
        model_path: the policy's prepared model folder (``model.path`` resolved); also
            the critic's backbone unless ``critic.model_path`` is set.

    Returns:
        ``(TrainerConfig, CriticConfig | None)`` from ``agentrl.trainer.config``: dtype
        from ``model.dtype``, device from ``trainer.device`` and seed from ``run.seed``
        for both; the critic's is ``None`` unless ``algorithm.uses_critic``.

    Raises:
        ConfigError: ``trainer.kl.reference_path`` set to a folder whose vocabulary
            differs from the policy's (``check_reference_vocab``).
    """
    policy = _policy_config(cfg, model_path)
    if cfg.trainer.kl.reference_path is not None:
        check_reference_vocab(model_path, cfg.trainer.kl.reference_path)
    critic = None
    if cfg.algorithm.uses_critic:  # turn_critic or gae: the same value model and trainer
        critic = _critic_config(cfg, model_path)
    return policy, critic


class RolePlacement(_Section):
    """What Ray reserves for one actor of a role (one trainer rank, one rollout engine, one
    sandbox host): the ``.options(num_cpus=, num_gpus=, resources=)`` of that actor."""

    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs Ray reserves per actor of this role.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs Ray reserves per actor of this role (fractions share a GPU).")
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources per actor, e.g. {'rollout': 1} to place this role only on nodes "
                    "started with `ray start --resources '{\"rollout\": 4}'`. Names non-empty, amounts >= 0.",
    )

    @field_validator("resources")
    @classmethod
    def _resource_names(cls, resources: dict[str, float]) -> dict[str, float]:
        for name, amount in resources.items():
            if not name.strip():
                raise ValueError(f"a resource name must be non-empty, got {resources!r}")
            if amount < 0:
                raise ValueError(f"the amount of {name!r} must be >= 0, got {resources!r}")
        return resources


class SandboxPlacement(RolePlacement):
    """``RolePlacement`` of a sandbox host: half a CPU unless set, also when only its
    ``resources`` are given (a host mostly waits on its sandboxes' processes)."""

    num_cpus: float = Field(0.5, ge=0, description="Logical CPUs Ray reserves per sandbox host.")


class PlacementConfig(_Section):
    """Per-role Ray reservations; ``agentrl.cluster.ray_setup.role_options`` turns an entry
    into actor options and ``check_placement`` checks them against the cluster at start-up."""

    trainer: RolePlacement = Field(
        default_factory=lambda: RolePlacement(num_cpus=1.0),
        description="One trainer rank (trainer.num_ranks of them).",
    )
    rollout: RolePlacement = Field(
        default_factory=lambda: RolePlacement(num_cpus=1.0),
        description="One rollout engine: a vLLM engine, its agent loop and (with cluster.sandbox_hosts=0) its sandboxes.",
    )
    sandbox: SandboxPlacement = Field(
        default_factory=SandboxPlacement,
        description="One sandbox host (cluster.sandbox_hosts of them).",
    )
    eval: RolePlacement = Field(
        default_factory=lambda: RolePlacement(num_cpus=1.0),
        description="The dedicated eval engine of asynchronous training (eval.engine dedicated, "
                    "agentrl.cluster.async_eval): a vLLM engine and its sandboxes that evaluate one policy version "
                    "at a time while training goes on.",
    )


class ClusterConfig(_Section):
    address: str | None = Field(
        None,
        description="None: always start a new local Ray instance (ray.init(address='local')), whatever "
                    "RAY_ADDRESS or an earlier `ray start` says. 'auto' (RAY_ADDRESS, else the cluster the last "
                    "`ray start` on this machine recorded), 'host:port' or 'ray://host:port': join that running "
                    "cluster (cluster.num_cpus is then ignored). Inside a `ray job submit` job pass "
                    "cluster.address=auto.",
    )
    num_cpus: int | None = Field(None, ge=1, description="Logical CPUs for a local Ray instance (None: detected).")
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig,
        description="What Ray reserves per actor of each role (trainer rank, rollout engine, sandbox host); "
                    "checked against the cluster's nodes at start-up.",
    )
    node_wait_s: float = Field(
        0.0, ge=0,
        description="After a rollout engine is lost (its node removed, its actor killed): 0 regenerates its "
                    "in-flight episodes on the remaining engines at once; > 0 first starts a replacement engine "
                    "(same placement) and waits up to this many seconds for it, saying so in the log. With no "
                    "engine left and none back in time the run stops with a ClusterError (the last checkpoint "
                    "stays intact).",
    )
    rendezvous_timeout_s: float = Field(
        120.0, gt=0,
        description="Seconds the trainer ranks have to meet at rank 0's node (the process group's TCP store "
                    "and its first collective); a rank that does not arrive in time stops the run with a "
                    "ClusterError naming rank 0's node address and port instead of a silent hang.",
    )
    weight_sync: Literal["object_store", "collective"] = Field(
        "object_store",
        description="How new weights reach every engine after an update (agentrl.cluster.weight_sync). "
                    "'object_store': trainer rank 0 puts one flat buffer in Ray's object store and every engine "
                    "reads it (zero-copy on its node) in parallel; the fast choice on CPU. 'collective': rank 0 "
                    "broadcasts the buffer over a process group of its own with the engines (NCCL where the "
                    "trainer has a GPU, gloo on CPU), formed within cluster.rendezvous_timeout_s.",
    )
    sandbox_hosts: int = Field(
        0, ge=0,
        description="0: every rollout actor runs its sandboxes in its own process, on its own node. N > 0: N "
                    "SandboxHost actors, placed with cluster.placement.sandbox, hold every sandbox (the backend "
                    "is resolved on each host's node) and the rollout actors reach them through Ray; each "
                    "rollout actor sends a new sandbox to the host where it has the fewest open, ties in turn. "
                    "A lost host makes its episodes infra_error, never a reward, and takes no new sandboxes.",
    )

    @field_validator("address")
    @classmethod
    def _address(cls, address: str | None) -> str | None:
        """``"local"`` (Ray's word for a new local instance) is the unset address, so it gets
        ``cluster.num_cpus`` and ignores ``RAY_ADDRESS`` like None; an empty one is an error."""
        if address is None:
            return None
        if not address.strip():
            raise ValueError(f"got {address!r}; expected 'auto', 'host:port' or 'ray://host:port', "
                             "or leave it unset (null) to start a local Ray instance")
        return None if address.strip() == "local" else address.strip()


class ControllerConfig(_Section):
    """How rollout and training interleave (``agentrl.cluster.controller`` and
    ``agentrl.cluster.async_controller``)."""

    mode: Literal["sync", "async"] = Field(
        "sync",
        description="sync: each iteration rolls out, then trains, then syncs weights; engines idle through the "
                    "update and the trainer through the rollout, and every row is on-policy (staleness 0). "
                    "async: engines keep generating while the trainer updates; each update takes "
                    "env.tasks_per_iteration complete groups from a buffer, trading staleness (at most "
                    "controller.max_staleness policy versions) for throughput.",
    )
    max_staleness: int = Field(
        1,
        description="async only: k, the most policy versions a trained row's oldest token may lag the "
                    "trainer's version (AReaL's bound: at most (k+1) * env.tasks_per_iteration groups admitted "
                    "and not yet trained; a row older than k is dropped and its task re-issued, never trained). "
                    "0 is the synchronous schedule on the streaming engines; larger k keeps engines busier but "
                    "trains on older samples (the decoupled objective corrects for it).",
    )
    partial_rollout: Literal["continue", "drain", "restart"] = Field(
        "continue",
        description="async only: what episodes in flight do at a weight update. continue: in-flight generations "
                    "are preempted and resumed on the new weights (each token keeps the version that sampled it; "
                    "sandboxes stay alive): no wasted tokens, mixed-version turns. drain: in-flight generations "
                    "finish on the old weights before the load (turns never span versions; the load waits for "
                    "the longest generation). restart: in-flight episodes start again from env.reset under the "
                    "new weights (single-version episodes; the work done so far is thrown away).",
    )

    @field_validator("max_staleness")
    @classmethod
    def _max_staleness(cls, k: int) -> int:
        if k < 0:
            raise ValueError(f"got {k}; expected an integer >= 0 (policy versions a trained row may lag the trainer)")
        return k


class EvalConfig(_Section):
    """Held-out evaluation (``agentrl eval``, ``agentrl.cluster.evaluate``): one fixed sampling
    configuration and token budget, so two evaluations (before / after training) measure the
    same thing. These settings replace the rollout section's for the eval's episodes."""

    split: str = Field("test", description="Task split evaluated (held out: an overlap with the training split is refused unless allowed).")
    engine: Literal["auto", "rollout", "dedicated"] = Field(
        "auto",
        description="Where evaluation during training runs. rollout: on the run's engines between an update and "
                    "the next rollout (controller.mode sync; nothing trains meanwhile). dedicated: on an engine of "
                    "its own (controller.mode async, cluster.placement.eval) that loads the weights of the version "
                    "evaluated and rolls out while training goes on, off the critical path; its results land in the "
                    "metrics line of the first iteration recorded after it finished (eval/policy_version and "
                    "eval/iteration say which). auto: rollout in sync mode, dedicated in async mode.",
    )
    samples: int = Field(4, ge=1, description="Samples per task, n: pass@1..n are reported (Chen et al. 2021's unbiased estimator).")
    num_tasks: int | None = Field(None, ge=1, description="Evaluate the split's first N tasks in its listed order (a cheaper, still fixed subset); None: all of them.")
    seed: int = Field(0, description="Seed of the environments' instances, the sampling and the bootstrap: same seed, same numbers.")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature (top_p 1, top_k off): the policy's own distribution, as pass@k from n samples assumes.")
    max_turns: int = Field(3, ge=1, description="Turn cap per eval episode.")
    max_new_tokens: int = Field(256, ge=1, description="Per-turn completion cap of an eval episode.")
    max_context_tokens: int | None = Field(
        None, ge=16, description="Whole-episode token budget of an eval episode; None (default): the rollout's "
                                 "(rollout.max_context_tokens, 2048 by default), so lowering the rollout's context "
                                 "lowers the eval's with it. Resolved when the config is built.")
    confidence: float = Field(0.95, gt=0.0, lt=1.0, description="Mass of the bootstrap intervals over tasks.")
    num_resamples: int = Field(1000, ge=1, description="Bootstrap resamples of the tasks per interval.")
    allow_overlap: bool = Field(False, description="Evaluate even when the eval tasks overlap the training tasks (refused by default: not held out).")
    every: int = Field(0, ge=0, description="During training: evaluate the policy after every N-th iteration's update, one policy version per eval, with this section's budget, where eval.engine says; metrics eval/* in that iteration's metrics line (async mode: the first line recorded after the eval finished), episodes stored as kind 'eval'. 0: never.")
    before_training: bool = Field(False, description="During training: evaluate the policy the run starts from (version 0) before iteration 0 with this section's budget, where eval.engine says (sync: the run's engines, before the first rollout; async: the dedicated eval engine, beside the first updates); metrics eval_before/* in iteration 0's metrics (async: the first line recorded after it finished), episodes stored as kind 'eval'. A resumed run does not repeat it.")
    after_training: bool = Field(False, description="During training: evaluate the final policy after the last iteration's update, where eval.engine says (as eval.every does; nothing extra when eval.every already evaluates that iteration); metrics eval/* in the last iteration's metrics (async: the last line waits for it).")

    @property
    def during_training(self) -> bool:
        """Whether the run's own engines evaluate (``every``, ``before_training`` or ``after_training``)."""
        return self.every > 0 or self.before_training or self.after_training


class ReplayConfig(_Section):
    url: str | None = Field(None, description="SQLAlchemy URL of the replay store (None: sqlite file replay.db in the run directory).")


class WandbConfig(_Section):
    """Weights & Biases (``pip install 'agentrl[wandb]'``): every metrics.jsonl line, under the
    same names, step = iteration (``agentrl.cluster.metric_sinks``)."""

    project: str = Field("agentrl", min_length=1, description="W&B project the run is logged to.")
    mode: Literal["offline", "online"] = Field(
        "offline", description="offline: written under RUN_DIR/wandb with no network (upload later with `wandb sync`); "
                               "online: streamed to the W&B server (needs `wandb login`).")
    entity: str | None = Field(None, description="W&B entity (user or team); None: the logged-in user's default.")
    tags: list[str] = Field(default_factory=list, description="Tags of the W&B run, 1-64 characters each (W&B's limit).")

    @field_validator("tags")
    @classmethod
    def _tag_lengths(cls, tags: list[str]) -> list[str]:
        """W&B refuses a tag outside 1-64 characters at ``wandb.init``; here it is a config
        error at load, before Ray or an engine starts."""
        for i, tag in enumerate(tags):
            if not 1 <= len(tag) <= 64:
                raise ValueError(f"logging.wandb.tags[{i}]={tag[:80]!r} has {len(tag)} characters; "
                                 "W&B takes tags of 1-64 characters")
        return tags


class LoggingConfig(_Section):
    """Where metrics go besides RUN_DIR/metrics.jsonl and the replay store (optional extras)."""

    tensorboard: bool = Field(False, description="Write every metrics.jsonl line as TensorBoard scalars under RUN_DIR/tensorboard, same names, step = iteration (`pip install 'agentrl[tensorboard]'`).")
    wandb: WandbConfig | None = Field(None, description="Log every metrics.jsonl line to Weights & Biases (see its fields); None: off.")


_IMPORTED_WITH: dict[str, tuple[object, tuple[str, ...]]] = {}
"""Env module name -> (the module object that import made, the names it added to sys.modules)."""


def modules_imported_with(name: str) -> tuple[str, ...] | None:
    """The modules that importing ``name`` (one of ``env.import_modules``) added to
    ``sys.modules`` in this process, itself and its own imports (a helper module beside it)
    among them; None when ``Config`` validation was not what imported it first (then it is
    unknown), and when ``sys.modules`` no longer holds the module that import made (it was
    removed or re-imported, perhaps from another file: the record would name another
    module's helpers). ``agentrl.cluster.ray_join`` ships the user's ones to a joined cluster."""
    import sys

    record = _IMPORTED_WITH.get(name)
    if record is None or sys.modules.get(name) is not record[0]:
        return None
    return record[1]


class Config(_Section):
    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    critic: CriticSection = Field(default_factory=CriticSection)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="before")
    @classmethod
    def _import_user_modules(cls, data: Any) -> Any:
        """Import ``env.import_modules`` before the sections validate, so the
        environments and estimators they register are known here (``algorithm.advantage``
        is checked against the estimator registry) and in every process that builds the
        config from its dict (the Ray actors)."""
        env = data.get("env") if isinstance(data, dict) else None
        names = env.get("import_modules") if isinstance(env, dict) else None
        if isinstance(names, list):
            import importlib
            import sys

            for name in names:
                if not isinstance(name, str) or not name:
                    continue  # the field's own validation reports it
                before = set(sys.modules)
                try:
                    importlib.import_module(name)
                except Exception as exc:
                    raise ValueError(
                        f"env.import_modules: module {name!r} could not be imported ({type(exc).__name__}: {exc}); "
                        "it must be importable (on sys.path / PYTHONPATH) in every process of the run"
                    ) from exc
                if name not in before:
                    _IMPORTED_WITH[name] = (sys.modules.get(name), tuple(m for m in sys.modules if m not in before))
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> "Config":
        if self.eval.max_context_tokens is None:  # the rollout's (EvalConfig.max_context_tokens)
            self.eval.max_context_tokens = self.rollout.max_context_tokens
        rc = self.trainer.rollout_correction
        if (rc.is_level is not None or rc.token_mask_band is not None or rc.seq_mask_band is not None) and (
            self.rollout.top_p < 1.0 or self.rollout.top_k > 0
        ):
            raise ValueError(
                f"trainer.rollout_correction (is_level={rc.is_level!r}, token_mask_band={rc.token_mask_band}, "
                f"seq_mask_band={rc.seq_mask_band}) with rollout.top_p={self.rollout.top_p}, "
                f"rollout.top_k={self.rollout.top_k}: importance weights compare the engine's log-probs with the "
                "trainer's, which cannot reproduce top-p/top-k truncation; use top_p=1.0 and top_k=-1, or turn "
                "the correction off"
            )
        if self.rollout.top_p < 1.0 or self.rollout.top_k > 0:
            raise ValueError(
                f"rollout.top_p={self.rollout.top_p}, rollout.top_k={self.rollout.top_k}: the trainer cannot "
                "recompute log-probs under top-p/top-k truncation; use top_p=1.0 and top_k=-1"
            )
        if self.algorithm.overlong_buffer_tokens > self.rollout.max_new_tokens:
            raise ValueError(
                f"algorithm.overlong_buffer_tokens={self.algorithm.overlong_buffer_tokens} must not exceed "
                f"rollout.max_new_tokens={self.rollout.max_new_tokens}"
            )
        if self.env.difficulty_filter != "off" and self.controller.mode != "sync":
            raise ValueError(f"env.difficulty_filter={self.env.difficulty_filter!r} with controller.mode="
                             f"{self.controller.mode!r}: the difficulty profile runs in sync mode only (it needs every "
                             "engine at one policy version); use controller.mode=sync or env.difficulty_filter=off")
        if self.controller.mode == "async":
            slots = self.rollout.num_engines * self.rollout.max_num_seqs
            if self.env.group_size > slots:
                raise ValueError(
                    f"controller.mode='async' with env.group_size={self.env.group_size} larger than "
                    f"rollout.num_engines * rollout.max_num_seqs = {self.rollout.num_engines} * "
                    f"{self.rollout.max_num_seqs} = {slots}: the engines cannot hold one group at once, so its "
                    f"members run one after another while the group ages toward controller.max_staleness="
                    f"{self.controller.max_staleness} and every update waits for it; use a smaller group or "
                    "more engines / sequences"
                )
        if self.eval.during_training:
            _check_eval_engine(self)
        if self.eval.during_training and self.eval_engine == "rollout" and \
                self.eval.max_context_tokens > self.rollout.max_context_tokens:
            raise ValueError(f"eval.max_context_tokens={self.eval.max_context_tokens} exceeds rollout.max_context_tokens="
                             f"{self.rollout.max_context_tokens}: evaluation during training runs on the run's engines, "
                             "whose context is the rollout's; lower eval.max_context_tokens or raise the rollout's")
        if self.trainer.device == "cpu" and self.trainer.backend == "nccl":
            raise ValueError("trainer.backend='nccl' needs trainer.device='cuda'")
        t = self.trainer
        if t.attn_implementation == "flash_attention_2" and (t.device != "cuda" or self.model.dtype != "bfloat16"):
            raise ValueError(
                f"trainer.attn_implementation='flash_attention_2' with trainer.device={t.device!r}, "
                f"model.dtype={self.model.dtype!r}: flash attention needs device 'cuda' and dtype 'bfloat16' "
                "(it has no CPU or fp32 kernel); use attn_implementation 'auto', which picks it where it can run"
            )
        # The trainers' own checks (one place: agentrl.trainer.config), on what
        # trainer_configs will build; the model folder is only known once prepared.
        _as_value_error(lambda: _policy_config(self, "<model.path>").validate(), "trainer.")
        _as_value_error(lambda: _critic_config(self, "<model.path>").validate(), "critic.")
        return self

    def run_dir(self) -> Path:
        return Path(self.run.dir) if self.run.dir else Path(self.run.output_dir) / self.run.name

    @property
    def eval_engine(self) -> str:
        """``eval.engine`` resolved: ``"rollout"`` or ``"dedicated"`` (``auto``: by ``controller.mode``)."""
        if self.eval.engine != "auto":
            return self.eval.engine
        return "dedicated" if self.controller.mode == "async" else "rollout"


def _check_eval_engine(cfg: "Config") -> None:
    """Evaluation during training fits the controller mode (``eval.engine``); raises
    ``ValueError`` naming the values otherwise (the config's cross-checks)."""
    ev, mode = cfg.eval, cfg.controller.mode
    on = ", ".join([f"eval.every={ev.every}"] * (ev.every > 0) + ["eval.before_training=true"] * ev.before_training
                   + ["eval.after_training=true"] * ev.after_training)  # what asked for evaluation during training
    if mode == "async" and ev.engine == "rollout":
        raise ValueError(f"eval.engine='rollout' with controller.mode='async' ({on}): the rollout "
                         "engines load new weights after every update and an episode may span versions, so an eval "
                         "on them would not measure one policy version; use eval.engine=dedicated (or auto)")
    if mode == "sync" and ev.engine == "dedicated":
        raise ValueError(f"eval.engine='dedicated' with controller.mode='sync' ({on}): a dedicated "
                         "eval engine runs beside asynchronous training only; sync mode evaluates on the run's "
                         "engines between updates (eval.engine=auto or rollout)")


def _section_keys(loc: Sequence[Any]) -> list[str] | None:
    """The keys the config section at ``loc`` accepts (``()``: the top level), or None when
    ``loc`` is not a section (e.g. inside ``env.kwargs``, which takes any key)."""
    model: Any = Config
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
    return list(model.model_fields)


def _unknown_key(loc: Sequence[Any]) -> str:
    """``unknown key 'run.iteratons'; did you mean 'run.iterations'?`` (close names by
    difflib, as Gymnasium suggests env ids), else the section's keys."""
    key = ".".join(str(p) for p in loc)
    keys = _section_keys(loc[:-1])
    if not keys:
        return f"unknown key '{key}'"
    prefix = "".join(f"{p}." for p in loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]), keys, n=3, cutoff=0.6)
    if close:
        return f"unknown key '{key}'; did you mean " + " or ".join(f"'{prefix}{c}'" for c in close) + "?"
    where = f"section '{prefix[:-1]}'" if prefix else "the top level"
    return f"unknown key '{key}'; {where} has: {', '.join(keys)}"


def _short_repr(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _format_validation_error(exc: ValidationError) -> str:
    """One line per pydantic error: ``key=value: what was expected``; an unknown key with the
    close names; a cross-field check (a model validator, whose ``input`` is the whole section
    or config) by its own message alone, which names the fields and values it compared."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "<config>"
        if err["type"] == "extra_forbidden":
            lines.append(_unknown_key(loc))
        elif err["type"] == "value_error" and isinstance(err.get("input"), dict):
            # A model validator (cross-field check): pydantic hands the whole section (or, at
            # the top level, the whole config with an empty loc) as input; never dump it.
            msg = str(err["ctx"]["error"]) if "error" in err.get("ctx", {}) else err["msg"]
            lines.append(msg if not loc or key in msg else f"{key}: {msg}")
        else:
            lines.append(f"{key}={_short_repr(err.get('input'))}: {err['msg']}")
    return "invalid config: " + "; ".join(lines)


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key.sub=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from exc
    return key.split("."), value


def config_from_dict(data: dict[str, Any], overrides: Sequence[str] = ()) -> Config:
    """Build a validated ``Config`` from a mapping plus ``key.sub=value`` overrides.

    Raises:
        ConfigError: unknown key, wrong type or out-of-range value (the message names each).
    """
    data = _deep_copy(data)
    for item in overrides:
        path, value = _parse_override(item)
        node = data
        for p in path[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: '{p}' is not a section")
            node = nxt
        node[path[-1]] = value
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


DEFAULT_CONFIG_RESOURCE = "defaults/shell_lookup.yaml"
"""The embedded default run config, package data of ``agentrl`` (read with
``importlib.resources``, so it works from any install); ``examples/shell_lookup.yaml`` is the
same file for users to copy."""


def _yaml_mapping(text: str, where: str) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {where!r} is not valid YAML: {exc}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {where!r} must hold a mapping, got {type(loaded).__name__}")
    return loaded


def code_defaults(overrides: Sequence[str] = ()) -> Config:
    """The config classes' own field defaults (each field's documented default) plus
    ``overrides``: a config built from scratch in code. Not what ``agentrl train`` runs
    without a file; that is the embedded default, ``load_default_config``
    (``agentrl.default_config``), whose rollout, eval and env sections differ.

    Raises:
        ConfigError: an override is malformed or invalid.
    """
    return config_from_dict({}, overrides)


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    """Load the YAML file at ``path`` and apply ``overrides`` (``key.sub=value``).

    ``path=None`` gives ``code_defaults(overrides)``, the config classes' defaults, *not*
    the embedded default that ``agentrl train`` runs without a file
    (``load_default_config``). It stays for the scripts and tests that call it so (it is
    public API as ``agentrl.load_config``); new code names what it means with
    ``code_defaults`` or ``load_default_config``.

    Raises:
        ConfigError: the file is missing or not a YAML mapping, or validation fails.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        data = _yaml_mapping(p.read_text(), str(p))
    return config_from_dict(data, overrides)


def default_config_text() -> str:
    """The text of the embedded default config (``agentrl/defaults/shell_lookup.yaml``)."""
    return resources.files("agentrl").joinpath(DEFAULT_CONFIG_RESOURCE).read_text(encoding="utf-8")


def load_default_config(overrides: Sequence[str] = ()) -> Config:
    """The embedded default (what ``agentrl train`` runs without a config file): one CPU
    machine, SmolLM2-135M-Instruct, ShellLookup (look-up jobs with a bash tool in a sandbox),
    GRPO, held-out eval before and after training; plus ``overrides``.

    Raises:
        ConfigError: an override is malformed or invalid.
    """
    return config_from_dict(_yaml_mapping(default_config_text(), f"agentrl/{DEFAULT_CONFIG_RESOURCE}"), overrides)


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d
