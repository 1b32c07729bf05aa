"""The run's own sections: ``run``, ``model``, ``env``, ``rollout``, ``sandbox`` and
``algorithm`` (with its ``gigpo`` sub-section). Each field carries its default and why."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from agentrl.config.base import Section
from agentrl.errors import ConfigError
from critics.registry import get_estimator


class RunConfig(Section):
    name: str = Field("humaneval-smollm2", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}$",
                      description="Run name (letters, digits, '_', '.', '-'); the run directory is output_dir/name unless run.dir is set. It also labels the run's sandboxes.")
    output_dir: str = Field("runs", description="Parent directory of run directories.")
    dir: str | None = Field(None, description="Explicit run directory (overrides output_dir/name).")
    seed: int = Field(0, description="Seed of task order, sampling and trainer init. Same seed, same run (CPU).")
    iterations: int = Field(3, ge=1, description="Number of rollout→update iterations to run in total (a resumed run continues up to this).")
    checkpoint_every: int = Field(1, ge=1, description="Save a checkpoint every N iterations (and always at the end).")


class ModelConfig(Section):
    path: str = Field(
        "smollm2-135m-instruct",
        description="A short name that `agentrl models prepare` knows (smollm2-135m-instruct, tiny-random-smollm2), a local HF folder, or a hub id.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Engine and trainer dtype. float32 on CPU: a bf16 engine silently drops most of a small AdamW update (platform notes).",
    )


class EnvConfig(Section):
    id: str = Field("agentrl/HumanEval-v0", description="Registered gymnasium id.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for gymnasium.make.")
    import_modules: list[str] = Field(default_factory=list, description="Modules that register environments when imported (yours, e.g. my_envs); imported in the driver and in every Ray actor. Installed packages can use the 'agentrl.environments' entry-point group instead.")
    split: str = Field("train", description="Task split the TaskSource draws from.")
    task_ids: list[str] | None = Field(None, description="Train on these task ids only (each must belong to the split); None: the whole split.")
    tasks_per_iteration: int = Field(4, ge=1, description="Distinct task instances (groups) per iteration.")
    group_size: int = Field(4, ge=1, description="Rollouts per task instance (GRPO group size).")
    difficulty_filter: Literal["off", "skip_solved_and_unsolved"] = Field(
        "off", description="Difficulty-aware task sampling (both controller modes; in async mode the profile runs on the stream with admission paused, and groups admitted before it keep their tasks): before iteration 1, and every profile_every iterations, the run's engines roll out every training task profile_samples times with the rollout's own sampling and limits; tasks whose pass rate is 0 or 1 under that policy version with every sample's reward equal (a group with no reward variance, no gradient; a partial-credit reward that differs keeps a task) are skipped until the next profile. The profiling tokens count in tokens/generated (and tokens/discarded). When every task would be skipped, the run trains on all of them (a warning, profile/fallback_all 1). off: the task order is exactly the unfiltered one.")
    profile_samples: int = Field(4, ge=2, description="Samples per task in a difficulty profile (n; errored samples are left out of n). At least 2: with 1 every pass rate is 0 or 1.")
    profile_every: int = Field(0, ge=0, description="Re-profile the tasks before every N-th iteration (iterations 1, N + 1, 2N + 1 ...) with the policy of that moment; 0: once, before iteration 1.")


class RolloutConfig(Section):
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
    env_workers: int = Field(8, ge=1, description="Threads running environment steps and closes (sandbox execs) while the engine keeps generating; as many more run resets, so a reset that waits for what running episodes hold (a server's sessions) never holds up their steps.")
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
    def _check(self) -> RolloutConfig:
        if self.max_new_tokens >= self.max_context_tokens:
            raise ValueError(
                f"rollout.max_new_tokens={self.max_new_tokens} must be smaller than rollout.max_context_tokens={self.max_context_tokens}"
            )
        if any(not s for s in self.stop_strings):
            raise ValueError(f"rollout.stop_strings={self.stop_strings!r} holds an empty string; expected non-empty strings "
                             "(an empty one would end every turn at its first token)")
        return self


class SandboxConfig(Section):
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
    """The registration of ``name`` in ``critics``' estimator registry. Raises
    ``ConfigError`` naming the registered ones."""

    return get_estimator(name)


class GiGPOSection(Section):
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


class AlgorithmConfig(Section):
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
