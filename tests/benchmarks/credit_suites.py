"""The settings of ``tests/benchmarks/bench_credit.py``: one ``Suite`` per environment, as config
overrides that every estimator shares, plus the few per-estimator lines (``ESTIMATOR_OVERRIDES``).
Pure data and string building; ``tests/unit/benchmarks/test_bench_credit_report.py`` loads every
suite's config to catch a misspelt key.

Held equal across estimators within a suite: the start weights (``model.path``), the task order
and per-request sampling seeds (``run.seed``), the episodes per update (``env.tasks_per_iteration``
x ``env.group_size``), every rollout, trainer and eval setting, and the number of updates. What
differs is ``algorithm.advantage`` and the settings only that estimator reads:

* GiGPO runs with ``algorithm.gigpo.mode=mean_std_norm`` (the paper's ``F = std``, Feng et al. 2025,
  Eq. 3 and 7), so that its episode-level term equals GRPO's advantage exactly (GRPO's
  ``norm_by_std`` with the same unbiased std and epsilon) and the two differ only by the step term
  ``omega * A_S``; with the default ``mean_norm`` its advantages would be on another scale than
  GRPO's and a difference could come from the scale alone.
* The turn critic trains ``critic.*`` at its defaults (lr 1e-5, value head initialised to 0).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

ESTIMATORS = ("grpo", "gigpo", "turn_critic")
ESTIMATOR_OVERRIDES: dict[str, tuple[str, ...]] = {
    "grpo": (),
    "gigpo": ("algorithm.gigpo.mode=mean_std_norm",),
    "turn_critic": (),
}
"""Per-estimator lines beside ``algorithm.advantage`` (module docstring)."""


@dataclass(frozen=True)
class Suite:
    """One environment's comparison.

    Attributes:
        name: the directory under ``--out`` and the name on the command line.
        config: a YAML config (repo-relative) the overrides apply to, or ``None`` for the
            built-in defaults.
        overrides: ``key=value`` lines shared by every estimator of the suite.
        iterations: updates per run (``run.iterations``).
        minutes_per_run: expected wall minutes of one run on the machine the suite is for
            (estimate; the result files record the real ones).
        why: one paragraph on the choice of environment and size, printed by ``--list``.
        gpu: a ``--gpu`` preset.
    """

    name: str
    config: str | None
    overrides: tuple[str, ...]
    iterations: int
    minutes_per_run: float
    why: str
    gpu: bool = False

    def run_overrides(self, estimator: str, seed: int, run_dir: str, *, model: str | None = None,
                      extra: tuple[str, ...] = ()) -> list[str]:
        """The overrides of one run: the suite's, the estimator's, then ``extra`` (the command
        line's ``--set``, last so they win).

        Raises:
            ValueError: an estimator not in ``ESTIMATOR_OVERRIDES``.
        """
        if estimator not in ESTIMATOR_OVERRIDES:
            raise ValueError(f"estimator={estimator!r}; expected one of {', '.join(ESTIMATOR_OVERRIDES)}")
        out = [*self.overrides, f"run.dir={run_dir}", f"run.iterations={self.iterations}", f"run.seed={seed}",
               f"run.checkpoint_every={self.iterations}", f"algorithm.advantage={estimator}",
               *ESTIMATOR_OVERRIDES[estimator]]
        if model:
            out.append(f"model.path={model}")
        return [*out, *extra]

    def fingerprint(self, extra: tuple[str, ...] = (), model: str | None = None) -> str:
        """A short hash of everything that defines the suite's runs but the estimator and seed: two
        result files with different fingerprints were made with different settings."""
        blob = json.dumps([self.config, self.overrides, self.iterations, ESTIMATOR_OVERRIDES, model, list(extra)])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


_SHELL_WHY = (
    "examples/shell_lookup_learn.yaml unchanged but for the number of updates: 6 instead of 8. "
    "That example takes about 24 min on 2 cores for 8 iterations with its two held-out evals "
    "(about 2.2 min each, 24 tasks x 4 samples), so about 2.4 min per iteration; 6 iterations give "
    "4.5 + 6 x 2.4 = about 19 min for GRPO and GiGPO, and the turn critic adds a value model's "
    "forward and update each iteration (estimated 20-25 min), so one seed of all three is about "
    "an hour. 6 x 16 = 96 training episodes, about 10,000 rollout tokens per run.")
_GUESS_WHY = (
    "The longer-horizon env with recurring anchor states. agentrl/GuessNumber-v0 (secret 1..10, 5 "
    "guesses): its anchor is the interval still consistent with the feedback, so trajectories of "
    "one task that narrowed it alike share an anchor whatever the path or the turn. SmolLM2-135M "
    "solves 10-20 % of games untrained (docs/benchmarks.md, Credit assignment). Sokoban and "
    "TextWorld were checked and give it no success: Sokoban no valid move in its first 64 replies "
    "(docs/benchmarks.md), TextWorld 0 of 32 episodes on its smallest games (1 room, 3 objects, "
    "quest length 1, valid commands listed; the model chats instead of giving a command). 4 tasks x 8 "
    "rollouts per update (groups of 8, as the shell suite), 8 updates, lr 5e-5 (the learning "
    "example's), held-out eval 48 test tasks x 4 samples before and after. Estimated 15-20 min per "
    "run on 2 cores (8 updates of 32 short episodes took about 13 min in the earlier GuessNumber "
    "bench, plus two evals).")
_TW_CPU_WHY = (
    "agentrl/TextWorld-v0 at its smallest on 2 cores. Not in the default list: SmolLM2-135M solved "
    "0 of 32 of these games untrained, so every group is all failures and no estimator gets a "
    "gradient; kept to rerun that check with another model (--model).")
_GPU_WHY = (
    "GPU preset (not run on the 2-core machine): a 1.5B instruct model, bf16, trainer, critic and "
    "vLLM engine sharing one GPU (half each in Ray's placement). The device settings follow "
    "docs/cluster.md and the config's fields; they have not been run: --set key=value overrides any "
    "of them.")

_GPU_INFRA = ("model.dtype=bfloat16", "trainer.device=cuda", "trainer.backend=nccl",
              "cluster.placement.trainer.num_gpus=0.5", "cluster.placement.rollout.num_gpus=0.5",
              "rollout.kv_cache_gb=16", "rollout.max_num_seqs=256", "trainer.micro_batch_tokens=16384",
              "run.output_dir=runs")
GPU_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
"""The GPU preset's policy (a hub id; a local folder with ``--model`` where the machine is offline)."""

_TW_SMALL = '{"nb_rooms": 1, "nb_objects": 3, "quest_length": 1, "max_steps": 6, "show_admissible_commands": true}'
_TW_ALFWORLD_LIKE = ('{"nb_rooms": 4, "nb_objects": 10, "quest_length": 4, "max_steps": 30, '
                     '"show_admissible_commands": true}')
"""Household-style generated games in the spirit of ALFWorld (Shridhar et al. 2021): several rooms,
containers and a multi-step quest, the valid commands listed each step (as ALFWorld's admissible
actions), a 30-step limit."""

SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("shell", "examples/shell_lookup_learn.yaml", (), iterations=6, minutes_per_run=21.0, why=_SHELL_WHY),
    Suite("guess", None, (
        "env.id=agentrl/GuessNumber-v0", 'env.kwargs={"low": 1, "high": 10, "max_guesses": 5}',
        "env.split=train", "env.tasks_per_iteration=4", "env.group_size=8",
        "rollout.max_turns=5", "rollout.max_new_tokens=32", "rollout.max_context_tokens=1536",
        "rollout.temperature=1.0", "rollout.kv_cache_gb=1", "model.dtype=float32", "trainer.lr=5.0e-5",
        "trainer.micro_batch_tokens=1536", "sandbox.backend=auto",
        "eval.split=test", "eval.num_tasks=48", "eval.samples=4", "eval.max_turns=5", "eval.max_new_tokens=32",
        "eval.temperature=1.0", "eval.before_training=true", "eval.after_training=true",
    ), iterations=8, minutes_per_run=18.0, why=_GUESS_WHY),
    Suite("textworld", None, (
        "env.id=agentrl/TextWorld-v0", f"env.kwargs={_TW_SMALL}", "env.split=train",
        "env.tasks_per_iteration=4", "env.group_size=8", "rollout.max_turns=6", "rollout.max_new_tokens=32",
        "rollout.max_context_tokens=2048", 'rollout.stop_strings=["</action>"]', "rollout.temperature=1.0",
        "rollout.kv_cache_gb=1", "model.dtype=float32", "trainer.lr=5.0e-5", "trainer.micro_batch_tokens=2048",
        "eval.split=test", "eval.num_tasks=24", "eval.samples=4", "eval.max_turns=6", "eval.max_new_tokens=32",
        "eval.temperature=1.0", "eval.before_training=true", "eval.after_training=true",
    ), iterations=8, minutes_per_run=25.0, why=_TW_CPU_WHY),
)}
"""The 2-core suites. The default run is ``shell`` and ``guess`` (``DEFAULT_SUITES``)."""

GPU_SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("shell", "examples/shell_lookup_learn.yaml", (
        *_GPU_INFRA, f"model.path={GPU_MODEL}", "env.tasks_per_iteration=8", "trainer.lr=1.0e-6",
        "eval.num_tasks=60", "eval.every=10",
    ), iterations=60, minutes_per_run=60.0, why=_GPU_WHY, gpu=True),
    Suite("textworld", None, (
        *_GPU_INFRA, f"model.path={GPU_MODEL}",
        "env.id=agentrl/TextWorld-v0", f"env.kwargs={_TW_ALFWORLD_LIKE}", "env.split=train",
        "env.tasks_per_iteration=16", "env.group_size=8", "rollout.max_turns=30", "rollout.max_new_tokens=96",
        "rollout.max_context_tokens=4096", "rollout.prompt_mode=per_step", "rollout.history_length=4",
        'rollout.stop_strings=["</action>"]', "rollout.temperature=1.0", "trainer.lr=1.0e-6",
        "eval.split=test", "eval.num_tasks=100", "eval.samples=4", "eval.max_turns=30", "eval.max_new_tokens=96",
        "eval.temperature=1.0", "eval.before_training=true", "eval.after_training=true", "eval.every=20",
    ), iterations=150, minutes_per_run=180.0, why=_GPU_WHY + " TextWorld games are ALFWorld-like (_TW_ALFWORLD_LIKE).",
        gpu=True),
)}
"""The ``--gpu`` presets: the same suites' names with a larger model and ALFWorld-like games."""

DEFAULT_SUITES = ("shell", "guess")
DEFAULT_GPU_SUITES = ("shell", "textworld")

SMOKE = ("model.path=tiny-random-smollm2", "model.dtype=float32", "run.iterations=1", "run.checkpoint_every=1",
         "env.tasks_per_iteration=2", "env.group_size=2", "rollout.max_new_tokens=16", "rollout.max_turns=2",
         "rollout.kv_cache_gb=1", "eval.num_tasks=2", "eval.samples=2", "eval.max_new_tokens=16", "eval.max_turns=2",
         "eval.before_training=true", "eval.after_training=true", "eval.every=0", "trainer.device=cpu",
         "trainer.backend=gloo", "cluster.placement.trainer.num_gpus=0", "cluster.placement.rollout.num_gpus=0")
"""``--smoke``: appended after a suite's overrides (so they win): the tiny random model, 1 iteration, 2
tasks of 2 rollouts, a 2-task eval; proves the pipeline end to end in a few minutes, measures nothing."""


def suites_for(gpu: bool) -> dict[str, Suite]:
    """``GPU_SUITES`` or ``SUITES``."""
    return GPU_SUITES if gpu else SUITES
