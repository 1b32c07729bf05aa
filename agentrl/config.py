"""The run configuration: pydantic models, loaded from YAML plus ``key=value`` overrides.

Every field carries its default and why. Validation happens here, in one place, and a bad
key or value raises ``ConfigError`` naming the key, the value and what was expected.

Example::

    cfg = load_config("examples/humaneval.yaml", ["rollout.max_turns=2", "run.iterations=5"])
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature; the trainer scores at the same temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling. The trainer refuses top_p < 1 (it cannot reproduce it exactly).")
    top_k: int = Field(-1, description="Top-k sampling (-1 = off). The trainer refuses top_k > 0.")
    kv_cache_gb: float = Field(1.0, gt=0.0, description="vLLM CPU KV cache size (VLLM_CPU_KVCACHE_SPACE), GiB.")
    max_num_seqs: int = Field(64, ge=1, description="vLLM's concurrent sequence cap.")
    env_workers: int = Field(8, ge=1, description="Threads running environment steps (sandbox execs) while the engine keeps generating.")
    check_template: bool = Field(True, description="At start-up, prove that turn-by-turn (delta) tokenization equals the full chat-template rendering; refuse to start otherwise. full_history only: per_step renders each step's whole prompt, so a template that cannot be extended turn by turn is fine there.")

    @model_validator(mode="after")
    def _check(self) -> "RolloutConfig":
        if self.max_new_tokens >= self.max_context_tokens:
            raise ValueError(
                f"rollout.max_new_tokens={self.max_new_tokens} must be smaller than rollout.max_context_tokens={self.max_context_tokens}"
            )
        return self


class SandboxConfig(_Section):
    backend: Literal["auto", "docker", "bwrap"] = Field("auto", description="auto: Docker when its daemon answers, else bubblewrap.")
    memory_mb: int = Field(1024, ge=16, description="Memory limit per sandbox, MiB.")
    cpus: float = Field(1.0, gt=0.0, description="CPU share per sandbox, cores.")
    pids_limit: int = Field(128, ge=8, description="Process limit per sandbox.")
    timeout_s: float = Field(10.0, gt=0.0, description="Default per-command timeout, seconds.")
    output_limit_bytes: int = Field(16 * 1024, ge=256, description="Cap per output stream of one command (head and tail kept).")
    pool_size: int = Field(0, ge=0, description="Warm sandboxes kept started ahead and handed out per episode (0: a fresh sandbox per episode, no pool).")
    max_sandboxes: int | None = Field(None, ge=1, description="With a pool: cap on sandboxes alive at once (episodes wait for one); None: pool_size, or more when episodes need them.")
    between_episodes: Literal["reset", "replace"] = Field("reset", description="With a pool: empty a returned sandbox's work dir and /tmp (reset) or start a fresh one (replace).")


def _estimator(name: str):
    """The registration of ``name`` in ``critics``' estimator registry (imported here, on
    first use, so loading a config stays cheap). Raises ``ConfigError`` naming the
    registered ones."""
    from critics.registry import get_estimator

    return get_estimator(name)


class AlgorithmConfig(_Section):
    advantage: str = Field(
        "grpo",
        description="Advantage estimator, a name registered in critics' registry (yours too: register it in a module listed in env.import_modules, or through the 'agentrl.estimators' entry-point group). Built-ins: grpo (group mean/std), rloo (leave-one-out mean), drgrpo (no std), gigpo (episode + anchor-state step groups), turn_critic (a learned value per turn and turn-level GAE with gamma/lam per turn), gae (PPO with a token-level critic: a learned value per sampled token and token-level GAE with token_gamma/token_lam per sampled token, observation tokens skipped). turn_critic and gae train the critic section's value model.",
    )
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda per turn for turn_critic (turn-level GAE). Not used by gae, which has token_lam.")
    norm_by_std: bool = Field(True, description="grpo only: divide by the group's std (rloo and drgrpo never do).")
    gamma: float = Field(0.95, ge=0.0, le=1.0, description="Discount per step for gigpo and per turn for turn_critic. Not used by gae, whose discount acts per sampled token (token_gamma): 0.95 per token would scale a reward 100 tokens back by 0.95**100 = 0.006.")
    token_gamma: float = Field(1.0, ge=0.0, le=1.0, description="gae only: discount per sampled token (observation and prompt tokens are skipped, not discounted). 1.0, verl's token-level PPO default: the episode's rewards reach every earlier token of the episode undiscounted.")
    token_lam: float = Field(1.0, ge=0.0, le=1.0, description="gae only: GAE lambda per sampled token. 1.0 (verl's default): advantage = return - V, unbiased, the critic only as a baseline; lower values (e.g. 0.95) trust the critic's bootstrap more, with less variance and more bias.")
    dynamic_sampling: bool = Field(False, description="DAPO dynamic sampling: drop groups whose (shaped) rewards are all equal (their tokens are counted as discarded), and roll out further task groups to refill, up to max_refill_rounds.")
    max_refill_rounds: int = Field(2, ge=0, description="Dynamic sampling: at most this many extra rollout rounds per iteration to replace dropped groups.")
    invalid_action_penalty: float = Field(0.0, ge=0.0, description="Subtracted from the reward of the step whose action was invalid (that step only; the recorded env reward is unchanged).")
    overlong_buffer_tokens: int = Field(0, ge=0, description="DAPO soft overlong punishment (Eq. 13) per turn: 0 disables; else the last N tokens before rollout.max_new_tokens are penalised linearly down to -overlong_penalty.")
    overlong_penalty: float = Field(1.0, ge=0.0, description="Scale of the soft overlong punishment.")
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


class _OptimSection(_Section):
    """The optimiser fields the ``trainer`` and ``critic`` sections share; each becomes the
    field of the same name of ``agentrl.trainer.config.OptimConfig`` (documented in full
    there), through ``trainer_configs``."""

    lr: float = Field(1e-6, gt=0.0, description="AdamW peak learning rate. 1e-6 is the usual order for RL on instruct LLMs (GRPO/DAPO recipes use 1e-6 to 3e-6); larger values destabilise the policy fast.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay. 0 as in TRL's GRPO defaults: RL runs are short and start from a pretrained model.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Clip the global gradient L2 norm to this; a step with a non-finite norm is skipped (train/skipped_step).")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up over this many optimizer steps, then constant.")
    micro_batch_size: int = Field(4, ge=1, description="Rows per forward/backward on one rank; only memory and speed depend on it (the loss uses global counts).")
    micro_batch_tokens: int | None = Field(None, ge=1, description="Optional cap on a micro-batch's padded size (rows x longest row), for long rows; None: no cap.")
    gradient_checkpointing: bool = Field(False, description="Recompute decoder-layer activations in backward: less memory, about 30% more time, same gradients up to rounding.")

    def optim_fields(self) -> dict[str, Any]:
        """This section's shared optimiser fields, by name."""
        return {name: getattr(self, name) for name in _OptimSection.model_fields}


class TrainerSection(_OptimSection):
    """The policy trainer (``agentrl.trainer.TrainerConfig``, built by ``trainer_configs``)
    and where it runs."""

    ppo_epochs: int = Field(1, ge=1, description="Passes (optimizer steps) over each batch; 1 is on-policy, as in GRPO.")
    clip_ratio_low: float = Field(0.2, description="PPO clip epsilon below 1, in [0, 1) (Schulman 2017).")
    clip_ratio_high: float = Field(0.2, description="PPO clip epsilon above 1, >= 0; DAPO's clip-higher uses 0.28.")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = Field("token-mean", description="Loss aggregation over the global batch: token-mean (every loss token weighs the same; DAPO), seq-mean-token-mean (GRPO's per-sequence mean) or seq-mean-token-sum.")
    num_ranks: int = Field(1, ge=1, description="FSDP2 ranks (trainer actors). CPU default 1: the 2 cores are shared with the engine.")
    backend: Literal["gloo", "nccl"] = Field("gloo", description="torch.distributed backend: gloo on CPU, nccl on GPUs.")
    device: Literal["cpu", "cuda"] = Field("cpu", description="Trainer device (the critic's too).")

    @field_validator("clip_ratio_low")
    @classmethod
    def _clip_low(cls, value: float) -> float:
        return _clip_ratio(low=value)

    @field_validator("clip_ratio_high")
    @classmethod
    def _clip_high(cls, value: float) -> float:
        return _clip_ratio(high=value)


def _clip_ratio(*, low: float | None = None, high: float | None = None) -> float:
    """Check one clip ratio with the trainer's own ``validate_clip_ratios`` (torch-free)."""
    from agentrl.trainer.config import validate_clip_ratios

    try:
        validate_clip_ratios(low, high)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return low if low is not None else high  # type: ignore[return-value]


class CriticSection(_OptimSection):
    """The value model, used when ``algorithm.advantage`` is ``turn_critic`` (a value per
    turn, read at the token before the turn's completion) or ``gae`` (a value per sampled
    token, read at the token before it). The same model and settings serve both
    (``agentrl.trainer.CriticConfig``, built by ``trainer_configs``); dtype, device and
    seed are the policy's."""

    model_path: str | None = Field(None, description="Backbone of the value model (None: the policy's model, a scalar head on top).")
    lr: float = Field(1e-5, gt=0.0, description="AdamW peak learning rate of the critic; critics usually learn about 10x faster than the policy (verl: 1e-5 vs 1e-6).")
    value_clip: float | None = Field(None, gt=0.0, description="PPO-style value clipping epsilon (None: plain MSE).")
    head_init_std: float = Field(0.0, ge=0.0, description="Std of the scalar head's initial weights (0: the critic starts at V=0).")
    epochs: int = Field(1, ge=1, description="Optimizer steps (passes over the batch) of the critic per iteration.")


def trainer_configs(cfg: "Config", model_path: str) -> tuple[Any, Any]:
    """The one place the trainers' dataclasses are built from the run config.

    Args:
        cfg: the validated run config.
        model_path: the policy's prepared model folder (``model.path`` resolved); also
            the critic's backbone unless ``critic.model_path`` is set.

    Returns:
        ``(TrainerConfig, CriticConfig | None)`` from ``agentrl.trainer.config``: dtype
        from ``model.dtype``, device from ``trainer.device`` and seed from ``run.seed``
        for both; the critic's is ``None`` unless ``algorithm.uses_critic``.
    """
    from agentrl.trainer.config import CriticConfig, TrainerConfig

    t = cfg.trainer
    common = {"dtype": cfg.model.dtype, "device": t.device, "seed": cfg.run.seed}
    policy = TrainerConfig(
        model_path=model_path, **common, **t.optim_fields(), ppo_epochs=t.ppo_epochs,
        clip_ratio_low=t.clip_ratio_low, clip_ratio_high=t.clip_ratio_high, loss_agg_mode=t.loss_agg_mode,
    )
    critic = None
    if cfg.algorithm.uses_critic:  # turn_critic or gae: the same value model and trainer
        c = cfg.critic
        critic = CriticConfig(
            model_path=c.model_path or model_path, **common, **c.optim_fields(),
            head_init_std=c.head_init_std, value_clip=c.value_clip, epochs=c.epochs,
        )
    return policy, critic


class ClusterConfig(_Section):
    address: str | None = Field(None, description="Ray address to join (None: start a local Ray instance).")
    num_cpus: int | None = Field(None, ge=1, description="Logical CPUs for a local Ray instance (None: detected).")


class ReplayConfig(_Section):
    url: str | None = Field(None, description="SQLAlchemy URL of the replay store (None: sqlite file replay.db in the run directory).")


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

            for name in names:
                if not isinstance(name, str) or not name:
                    continue  # the field's own validation reports it
                try:
                    importlib.import_module(name)
                except Exception as exc:
                    raise ValueError(
                        f"env.import_modules: module {name!r} could not be imported ({type(exc).__name__}: {exc}); "
                        "it must be importable (on sys.path / PYTHONPATH) in every process of the run"
                    ) from exc
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> "Config":
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
        if self.trainer.device == "cpu" and self.trainer.backend == "nccl":
            raise ValueError("trainer.backend='nccl' needs trainer.device='cuda'")
        return self

    def run_dir(self) -> Path:
        return Path(self.run.dir) if self.run.dir else Path(self.run.output_dir) / self.run.name


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


DEFAULT_CONFIG_RESOURCE = "defaults/humaneval.yaml"
"""The embedded default run config, package data of ``agentrl`` (read with
``importlib.resources``, so it works from any install); ``examples/humaneval.yaml`` is the
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


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    """Load YAML at ``path`` (None: built-in defaults) and apply overrides.

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
    """The text of the embedded default config (``agentrl/defaults/humaneval.yaml``)."""
    return resources.files("agentrl").joinpath(DEFAULT_CONFIG_RESOURCE).read_text(encoding="utf-8")


def load_default_config(overrides: Sequence[str] = ()) -> Config:
    """The embedded default (what ``agentrl train`` runs without a config file): one CPU
    machine, SmolLM2-135M-Instruct, HumanEval, GRPO; plus ``overrides``.

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
