"""``hub/ReasoningGym-v0``: reasoning-gym's procedural task families (Stojanovski et al.
2025, "REASONING GYM", arXiv:2505.24760; package ``reasoning-gym``, the extra
``agentrl[reasoning-gym]``) as one Gymnasium env: any family, or a weighted mix of them,
answered in one reply or over several attempts with feedback. Items are made in-process (no
sandbox); answers are scored in a worker process (``agentrl.hubs.reasoning_gym_scorer``).

Tasks and splits
    A task is one item of one family: ``<family>/s<seed>/<index>`` (``countdown/s0/17``),
    the item ``index`` of ``reasoning_gym.create_dataset(family, size=size, seed=seed,
    **config[family])``. Items are generated one at a time when a task is reset (reasoning-gym's
    procedural datasets make item ``i`` on access); listing tasks generates none. The
    ``train`` split is seed ``seed`` (env kwarg, default 0), ``test`` seed ``seed +
    TEST_SEED_OFFSET``: most families seed item ``i`` with ``seed + i``, so the two splits draw
    from disjoint seed ranges (held out as seeds; a family with a small problem space, such as
    ``gcd`` of one-digit numbers, can still pose one question in both). ``all`` is both.
    Family ``f`` of weight ``w`` lists ``round(size * w / max_weight)`` indices ``0..n-1`` per
    split (``size`` per family per split at weight 1), so a task source drawing uniformly from
    the list draws each family in proportion to its weight. The list interleaves the families
    index by index, so its first ``n`` ids (``eval.num_tasks``) hold every family. One family
    (acre in 0.1.25) generates its whole set in its constructor: its cost grows with ``size``.

Actions and reward
    The answer is the content of the reply's last ``<answer>...</answer>`` (reasoning-gym's
    own format; tags any case), stripped; the system prompt says so, and the next turn stops
    at ``</answer>`` (``StepInfo.stop_strings``). The family's own scorer
    (``dataset.score_answer(answer, entry)``, in [0, 1], partial credit in some families)
    scores it, never in this process: some scorers evaluate the answer as code (spiral_matrix's
    ``eval``, sympy's ``parse_expr`` in countdown and puzzle24), so it runs in the process's
    scoring worker (``reasoning_gym_scorer.shared_worker()``: under bubblewrap where it works,
    a forked child per answer), within ``score_timeout_s`` seconds. A reply without an answer
    (or an empty one) is an invalid action scored 0 (the scorer is not called: a missing
    answer is the model's format fault). Full marks (score 1) is success.

    ``attempts = 1`` (default): single-turn; the reward is the score and the episode
    terminates. ``attempts = k > 1``: a reply that is not fully right gets feedback (that it
    is not correct, its score when above 0, and the attempts left; never the reference) and
    another try, up to ``k`` replies; the episode terminates at full marks or after the
    ``k``-th reply (a rule of the game the prompt states, not a cut-off). The reward of
    attempt ``j`` is its gain over the best score before it, ``max(0, s_j - max(s_1..s_{j-1}))``,
    not its raw score: the episode's total is then the best score reached (in [0, 1], as in
    single-turn, so pass rates and difficulty profiles read it unchanged), and a policy cannot
    collect partial credit (countdown gives 0.01 for a malformed expression) once per attempt
    by never answering right. A wrong-then-right episode gets ``(0, 1)``; answering right
    at once is worth more through the discount of step returns (GiGPO's step advantage sees
    the 1 one step later), not by a bigger total.

Anchor (GiGPO, Feng et al. 2025, arXiv:2505.10978)
    ``(task_id, j)`` after ``j`` replies (``(task_id, 0)`` at reset): every trajectory of a
    task that has used ``j`` attempts without full marks faces the same question with the same
    attempts left, so GiGPO's step groups compare their next replies. Their histories (the
    earlier wrong answers) are left out of the key on purpose: larger groups for an
    approximate state, as ``agentrl/GuessNumber-v0``'s anchor leaves out its guesses left.

Failures
    A family or config the env cannot use is a ``ConfigError`` at construction and in
    ``task_ids`` (unknown families name their close matches). A family that fails to
    generate an item raises ``EnvError``; a scorer that raises or returns a value outside
    [0, 1], and a scoring worker that times out, exits or replies garbage (it is killed and
    restarted), ``RewardError`` naming the family and task: the rollout records
    ``infra_error`` / ``reward_error``, never a score of 0. Nothing is downloaded or installed
    while an env is made.

For a judge
    ``reset``'s info carries ``StepInfo.reference_answer`` (the item's ``answer``, when it has
    one) and the terminal step's ``StepInfo.final_answer`` (the extracted answer); the env keys
    are ``task_id``, ``split`` (reset), ``family``, ``attempt`` and ``score`` (steps).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import re
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from agentrl.errors import ConfigError, EnvError, RewardError
from agentrl.hubs import reasoning_gym_scorer
from agentrl.types import StepInfo
from environments.core import TextEnv, clip_text
from environments.seeded import SPLITS, last_tag_content

__all__ = ["ENV_ID", "SPLITS", "TEST_SEED_OFFSET", "DEFAULT_FAMILIES", "Mix", "ReasoningGymEnv", "family_names",
           "parse_task_id"]

ENV_ID = "hub/ReasoningGym-v0"
TEST_SEED_OFFSET = 1_000_000_000
"""The ``test`` split's seed is the ``train`` seed plus this."""
SEED_LIMIT = 2**32
"""``seed + TEST_SEED_OFFSET + size`` must stay at or below this: some families seed numpy's
legacy generator (``< 2**32``) with ``seed + index``."""
DEFAULT_FAMILIES = "basic_arithmetic"
DEFAULT_SIZE = 1000
ANSWER_TAG = "answer"
STOP_STRING = "</answer>"
SCORE_TOLERANCE = 1e-9
"""A score this far outside [0, 1] is float error (spell_backward sums ``1 / len`` per letter)
and is clipped into it; further out it is a ``RewardError``."""
FEEDBACK_ANSWER_CHARS = 300
"""A wrong answer is quoted in the feedback up to about this many characters."""
MIX_KWARGS = ("families", "config", "size", "seed")
"""The env kwargs that decide the task list (``task_ids(split, env_kwargs=...)`` reads them)."""
_OTHER_KWARGS = ("attempts", "score_timeout_s", "split", "render_mode", "sandbox")
_TASK_ID = re.compile(r"([A-Za-z0-9_]+)/s(0|[1-9][0-9]*)/(0|[1-9][0-9]*)", re.ASCII)


def _reasoning_gym() -> Any:
    """The ``reasoning_gym`` module (the optional extra, imported on first use so that
    registering and importing this module stay cheap). Raises ConfigError when it is missing."""
    try:
        import reasoning_gym  # the optional extra `reasoning-gym`
    except ImportError as exc:
        raise ConfigError(f"{ENV_ID} needs the reasoning-gym package ({exc}); install it with "
                          "pip install 'agentrl[reasoning-gym]' (reasoning-gym==0.1.25)") from exc
    return reasoning_gym


def _datasets() -> dict[str, tuple[Any, Any]]:
    """reasoning-gym's registry: family name -> (dataset class, config dataclass)."""
    _reasoning_gym()
    from reasoning_gym.factory import DATASETS  # the optional extra, loaded by _reasoning_gym

    return DATASETS


def family_names() -> list[str]:
    """Every family name of the installed reasoning-gym, sorted. Raises ConfigError without it."""
    return sorted(_datasets())


def parse_task_id(task_id: object) -> tuple[str, int, int]:
    """``(family, seed, index)`` of ``"<family>/s<seed>/<index>"`` (decimal, no leading zeros).

    Raises:
        ConfigError: any other value.
    """
    m = _TASK_ID.fullmatch(task_id) if isinstance(task_id, str) else None
    if m is None:
        raise ConfigError(f"task_id={task_id!r} is not a {ENV_ID} task id; expected '<family>/s<seed>/<index>', "
                          "e.g. 'countdown/s0/17'")
    return m.group(1), int(m.group(2)), int(m.group(3))


def _int(name: str, value: Any, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{name}={value!r} must be an int >= {low}")
    return value


def _weights(families: Any) -> dict[str, float]:
    """``families`` (a name, a list of names or ``{name: weight}``) as ``{name: weight}``."""
    if isinstance(families, str):
        families = [families]
    if isinstance(families, (list, tuple)):
        if not all(isinstance(f, str) for f in families):
            raise ConfigError(f"families={families!r}: a list must hold family names (str)")
        if len(set(families)) != len(families):
            raise ConfigError(f"families={families!r} names a family twice; give weights as {{name: weight}}")
        families = {f: 1.0 for f in families}
    if not isinstance(families, Mapping) or not families:
        raise ConfigError(f"families={families!r}; expected a family name, a non-empty list of names or "
                          "{name: weight}")
    out = {}
    for name, w in families.items():
        if (not isinstance(name, str) or isinstance(w, bool) or not isinstance(w, (int, float))
                or not math.isfinite(w) or w <= 0):
            raise ConfigError(f"families: {name!r}: {w!r}; expected a family name with a finite weight > 0")
        out[name] = float(w)
    known = _datasets()
    for name in out:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(f"families: {name!r} is not a reasoning-gym family{hint} (reasoning-gym has "
                              f"{len(known)} families: agentrl.hubs.reasoning_gym.family_names())")
    return out


def _check_config(family: str, kwargs: Any, size: int, seed: int) -> dict[str, Any]:
    """One family's difficulty kwargs, checked against its config dataclass (without building
    the dataset). Raises ConfigError naming the family, the key and the accepted fields."""
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise ConfigError(f"config[{family!r}]={kwargs!r}; expected a mapping of its config's fields to values")
    config_cls = _datasets()[family][1]
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("size", "seed")]
    unknown = sorted(set(kwargs) - set(fields))
    if unknown:
        where = "are env kwargs, not per-family settings" if set(unknown) <= {"size", "seed"} else "are not fields of " \
            f"{config_cls.__name__} (fields: {fields})"
        raise ConfigError(f"config[{family!r}]: {unknown} {where}")
    try:
        json.dumps(dict(kwargs))  # the datasets are cached by their config's JSON (_dataset)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config[{family!r}]={kwargs!r} is not plain data (numbers, strings, lists, "
                          f"mappings): {exc}") from exc
    try:
        cfg = config_cls(size=size, seed=seed, **kwargs)
        if callable(getattr(cfg, "validate", None)):
            cfg.validate()
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(f"config[{family!r}]={dict(kwargs)!r} (size={size}) is refused by reasoning-gym's "
                          f"{config_cls.__name__}: {type(exc).__name__}: {exc}") from exc
    return dict(kwargs)


@dataclass(frozen=True)
class Mix:
    """The task list of one set of env kwargs: which families, their weights and difficulty
    settings, ``size`` per family per split (at weight 1) and the train seed.

    Attributes:
        weights: family -> weight (> 0), in the order given.
        config: family -> difficulty kwargs of its reasoning-gym config (``{}``: its defaults).
        size: the dataset size each family is made with; indices below it are valid tasks.
        seed: the ``train`` seed (``test``: ``seed + TEST_SEED_OFFSET``).
    """

    weights: Mapping[str, float]
    config: Mapping[str, Mapping[str, Any]]
    size: int
    seed: int

    @classmethod
    def from_kwargs(cls, env_kwargs: Mapping[str, Any] | None = None) -> Mix:
        """The mix of the env kwargs (``families``, ``config``, ``size``, ``seed``; the env's
        other kwargs are allowed and ignored here).

        Raises:
            ConfigError: an unknown kwarg, family or config field, a bad weight, size or seed,
                or a family whose weight gives it no task at this ``size``.
        """
        kw = dict(env_kwargs or {})
        unknown = sorted(set(kw) - set(MIX_KWARGS) - set(_OTHER_KWARGS))
        if unknown:
            raise ConfigError(f"{ENV_ID}: unknown env kwargs {unknown}; expected some of "
                              f"{list(MIX_KWARGS) + list(_OTHER_KWARGS[:-1])}")
        size = _int("size", kw.get("size", DEFAULT_SIZE), 1)
        seed = _int("seed", kw.get("seed", 0), 0)
        if seed + TEST_SEED_OFFSET + size > SEED_LIMIT:
            raise ConfigError(f"seed={seed} with size={size}: seed + {TEST_SEED_OFFSET} + size must be <= 2**32 "
                              "(the test split's seeds)")
        weights = _weights(kw.get("families", DEFAULT_FAMILIES))
        config = kw.get("config") or {}
        if not isinstance(config, Mapping):
            raise ConfigError(f"config={config!r}; expected {{family: {{difficulty kwargs}}}}")
        stray = sorted(set(config) - set(weights))
        if stray:
            raise ConfigError(f"config names {stray}, which families={list(weights)} does not hold")
        checked = {f: _check_config(f, config.get(f, {}), size, seed) for f in weights}
        mix = cls(weights, checked, size, seed)
        empty = [f for f, n in mix.counts().items() if n == 0]
        if empty:
            raise ConfigError(f"families {empty} get no task: a family's tasks per split are "
                              f"round(size * weight / max weight) (size={size}); raise size or their weights")
        return mix

    def counts(self) -> dict[str, int]:
        """Tasks per split of each family: ``round(size * weight / max weight)``."""
        top = max(self.weights.values())
        return {f: int(round(self.size * w / top)) for f, w in self.weights.items()}

    def split_seeds(self, split: str) -> list[int]:
        """The seeds of ``split``. Raises ConfigError for an unknown split."""
        seeds = {"train": [self.seed], "test": [self.seed + TEST_SEED_OFFSET],
                 "all": [self.seed, self.seed + TEST_SEED_OFFSET]}
        if split not in seeds:
            raise ConfigError(f"split={split!r} is not one of {SPLITS}")
        return seeds[split]

    def task_ids(self, split: str = "train") -> list[str]:
        """``<family>/s<seed>/<index>`` of ``split``, per seed index by index with the families
        interleaved (index 0 of each family, then index 1 of each that has one, ...), so any
        prefix of the list (``eval.num_tasks``) holds every family. Generates no item.
        Raises ConfigError for an unknown split."""
        counts = self.counts()
        top = max(counts.values())
        return [f"{f}/s{s}/{i}" for s in self.split_seeds(split) for i in range(top)
                for f, n in counts.items() if i < n]

    def draw(self, split: str, rng: Any) -> str:
        """One task of ``split`` drawn uniformly with ``rng`` (a numpy ``Generator``), without
        listing them."""
        seeds, counts = self.split_seeds(split), self.counts()
        per_seed = sum(counts.values())
        position = int(rng.integers(len(seeds) * per_seed))
        seed, rest = seeds[position // per_seed], position % per_seed
        for family, n in counts.items():
            if rest < n:
                return f"{family}/s{seed}/{rest}"
            rest -= n
        raise AssertionError("a position beyond the split")  # position < len(seeds) * per_seed

    def split_of(self, task_id: str) -> str | None:
        """``"train"``, ``"test"`` or None (a seed of neither split)."""
        seed = parse_task_id(task_id)[1]
        return "train" if seed == self.seed else "test" if seed == self.seed + TEST_SEED_OFFSET else None

    def check_task(self, task_id: object) -> tuple[str, int, int]:
        """``(family, seed, index)`` of a task this mix can pose: a family of the mix, an index
        below ``size``, any seed the generators accept.

        Raises:
            ConfigError: a malformed id, another family, or an index out of range.
        """
        family, seed, index = parse_task_id(task_id)
        if family not in self.weights:
            raise ConfigError(f"task_id={task_id!r}: family {family!r} is not one of this env's families "
                              f"{list(self.weights)}")
        if index >= self.size:
            raise ConfigError(f"task_id={task_id!r}: index {index} is not below size={self.size}")
        if seed + self.size > SEED_LIMIT:
            raise ConfigError(f"task_id={task_id!r}: seed {seed} + size {self.size} exceeds 2**32")
        return family, seed, index


@functools.lru_cache(maxsize=64)
def _dataset(family: str, seed: int, size: int, config_json: str) -> tuple[Any, threading.Lock]:
    """The reasoning-gym dataset of one family, seed, size and config, with the lock its
    item generation runs under (the scoring worker makes its own). Cached per process:
    generators hold no episode state, and some load word lists or puzzle files when made,
    which every episode would otherwise repeat. Raises EnvError when reasoning-gym fails to make it."""
    try:
        ds = _reasoning_gym().create_dataset(family, size=size, seed=seed, **json.loads(config_json))
    except Exception as exc:
        raise EnvError(f"reasoning-gym failed to make family {family!r} (seed={seed}, size={size}, "
                       f"config={config_json}): {type(exc).__name__}: {exc}") from exc
    return ds, threading.Lock()


class ReasoningGymEnv(TextEnv):
    """reasoning-gym families as one env; see the module docstring.

    Args:
        sandbox: ignored (accepted so ``make_env(..., sandbox=...)`` works for every env).
        families: a family name, a list of names (equal weights) or ``{name: weight}``.
        config: ``{family: {difficulty kwargs}}``, the fields of each family's reasoning-gym
            config (e.g. ``{"countdown": {"min_numbers": 3, "max_numbers": 4}}``), never
            ``size`` or ``seed``; a family left out keeps its defaults.
        size: tasks per family per split at weight 1, and the size each dataset is made with.
        seed: the ``train`` split's seed (``test``: ``seed + TEST_SEED_OFFSET``).
        attempts: replies per episode (1: single-turn; k > 1: feedback after a reply without
            full marks).
        score_timeout_s: seconds one answer may take to score (past it: ``RewardError``, and
            the scoring worker is killed and restarted).
        split: the tasks ``reset`` draws from when ``options`` names none.
        render_mode: None or ``"ansi"``.

    Raises:
        ConfigError: a bad argument (``Mix.from_kwargs``), or reasoning-gym is not installed.
    """

    uses_sandbox = False  # the rollout makes it without a sandbox; answers are scored in a worker
    metadata = {"render_modes": ["ansi"]}

    def __init__(self, sandbox: Any = None, families: Any = DEFAULT_FAMILIES, config: Mapping[str, Any] | None = None,
                 size: int = DEFAULT_SIZE, seed: int = 0, attempts: int = 1,
                 score_timeout_s: float = reasoning_gym_scorer.DEFAULT_SCORE_TIMEOUT_S, split: str = "train",
                 render_mode: str | None = None) -> None:
        super().__init__()
        self.mix = Mix.from_kwargs({"families": families, "config": config, "size": size, "seed": seed})
        self.attempts = _int("attempts", attempts, 1)
        if (isinstance(score_timeout_s, bool) or not isinstance(score_timeout_s, (int, float))
                or not math.isfinite(score_timeout_s) or score_timeout_s <= 0):
            raise ConfigError(f"score_timeout_s={score_timeout_s!r} must be a finite number of seconds > 0")
        self.score_timeout_s = float(score_timeout_s)
        self.mix.split_seeds(split)  # validates the split
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode={render_mode!r}; expected None or 'ansi'")
        self.split, self.render_mode = split, render_mode
        self.entry: dict[str, Any] | None = None
        self.family: str | None = None
        self._key: tuple[str, int, int, str] | None = None
        self._attempt, self._best, self._last = 0, 0.0, ""

    @classmethod
    def task_ids(cls, split: str = "train", *, env_kwargs: Mapping[str, Any] | None = None) -> list[str]:
        """The ids of ``split`` for the env made with ``env_kwargs`` (its ``families``,
        ``size``, ``seed``, ``config``; defaults as the constructor's). Generates no item.

        Raises:
            ConfigError: an unknown split or a bad kwarg (``Mix.from_kwargs``).
        """
        return Mix.from_kwargs(env_kwargs).task_ids(split)

    @classmethod
    def warm_up(cls) -> None:
        """Start this process's scoring worker now (else the first answer starts it).

        Raises:
            RewardError: the worker did not start.
        """
        reasoning_gym_scorer.shared_worker().start()

    @classmethod
    def release_shared(cls) -> None:
        """Stop this process's scoring worker (the next answer starts it again). Run at exit,
        and by ``check_env`` before it counts what was left."""
        reasoning_gym_scorer.stop_shared_worker()

    @classmethod
    def checker_actions(cls) -> list[str]:
        """For ``check_env``: tagged answers, one without tags and an empty one; enough to end
        an episode of up to 8 attempts."""
        return ["<answer>0</answer>", "I am not sure.", "<answer></answer>", "<answer>1</answer>",
                "<ANSWER>2</ANSWER>", "<answer>yes</answer>", "<answer>-1</answer>", "<answer>3</answer>"]

    @property
    def system_prompt(self) -> str:
        more = (f" If your answer is not fully right you are told so and may answer again; you have {self.attempts} "
                "attempts." if self.attempts > 1 else "")
        return ("Solve the problem. You may think step by step first; then give only the final answer inside "
                f"<answer></answer> tags, in the format the problem asks for, e.g. <answer>42</answer>.{more}")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Pose ``options["task_id"]`` (else a task drawn from the split with ``np_random``).

        Raises:
            EnvError: after ``close``, or the family failed to generate the item.
            ConfigError: an unknown option, or a task id this env cannot pose (``Mix.check_task``).
        """
        requested = self._start_reset(seed, options)
        if requested is None:
            requested = self.mix.draw(self.split, self.np_random)
        family, task_seed, index = self.mix.check_task(requested)
        key = (family, task_seed, self.mix.size, json.dumps(self.mix.config[family], sort_keys=True))
        ds, lock = _dataset(*key)
        try:
            with lock:
                entry = ds[index]
        except Exception as exc:
            raise EnvError(f"reasoning-gym family {family!r} failed to generate item {index} (seed={task_seed}, "
                           f"size={self.mix.size}, config={key[3]}): {type(exc).__name__}: {exc}") from exc
        if not isinstance(entry, Mapping) or not isinstance(entry.get("question"), str) or not entry["question"]:
            raise EnvError(f"reasoning-gym family {family!r} item {index} (seed={task_seed}) has no question text: "
                           f"{entry!r:.200}")
        self._task_id, self._done, self._key = requested, False, key
        self.entry, self.family = dict(entry), family
        self._attempt, self._best = 0, 0.0
        self._last = f"{entry['question']}\n\nGive your final answer inside <answer></answer> tags."
        reference = entry.get("answer")
        info = StepInfo(anchor=(requested, 0), system_prompt=self.system_prompt, tools=(),
                        stop_strings=(STOP_STRING,), reference_answer=None if reference is None else str(reference)
                        ).to_info(task_id=requested, split=self.mix.split_of(requested), family=family)
        return self._last, info

    def _score(self, answer: str) -> float:
        assert self._key is not None and self.entry is not None and self._task_id is not None
        index = parse_task_id(self._task_id)[2]
        score = reasoning_gym_scorer.shared_worker().score(*self._key, self.entry, index, answer,
                                                           task_id=self._task_id, timeout_s=self.score_timeout_s)
        if not -SCORE_TOLERANCE <= score <= 1.0 + SCORE_TOLERANCE:
            raise RewardError(f"the scorer of reasoning-gym family {self.family!r} returned {score!r} on task "
                              f"{self._task_id!r}; expected a number in [0, 1]")
        return min(1.0, max(0.0, float(score)))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Score the reply's answer; feedback and another try while attempts are left (module
        docstring, "Actions and reward").

        Raises:
            EnvError: no episode running, or ``action`` is not a str.
            RewardError: the family's scorer raised or returned a value outside [0, 1], or the
                scoring worker timed out, exited or replied garbage.
        """
        self._check_step(action)
        assert self._task_id is not None
        self._attempt += 1
        tagged = last_tag_content(action, ANSWER_TAG)
        answer = tagged.strip() if tagged is not None else ""
        score = self._score(answer) if answer else 0.0
        reward = max(0.0, score - self._best)
        self._best = max(self._best, score)
        solved = score >= 1.0
        left = self.attempts - self._attempt
        self._done = solved or left == 0
        if solved:
            feedback = "Correct."
        elif not answer:
            feedback = "No answer found inside <answer></answer> tags."
        else:
            shown = clip_text(answer, FEEDBACK_ANSWER_CHARS)
            feedback = f"Your answer {shown!r} is not correct" + (f" (score {score:.2f} of 1)." if score > 0 else ".")
        if not solved:
            feedback += (" No attempts left." if left == 0 else
                         f" {left} attempt{'s' if left > 1 else ''} left: try again, with your final answer inside "
                         "<answer></answer> tags.")
        self._last = feedback
        info = StepInfo(anchor=(self._task_id, self._attempt), invalid_action=not answer,
                        success=solved if self._done else None,
                        final_answer=answer if self._done else None,
                        stop_strings=None if self._done else (STOP_STRING,),
                        ).to_info(task_id=self._task_id, family=self.family, attempt=self._attempt, score=score)
        return feedback, reward, self._done, False, info

    def render(self) -> str | None:
        return self._last if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Nothing to release (the datasets and the scoring worker are per process, the worker
        stopped at exit); idempotent."""
        super().close()
