"""The difficulty filter's pure parts: its config errors, when a run profiles (fresh, resumed,
``env.profile_every``), the profile's seed and budget, the skip set it sets (and the
all-filtered fallback), its token accounting, and ``agentrl tasks profile``'s eval overrides.
A stand-in pool hands back real ``Episode`` records here; the real profile (Ray, vLLM, the
store) is ``tests/integration/cluster/test_profile_train.py``."""

from __future__ import annotations

import json

import pytest

from agentrl.commands.evaluate import EvalTarget, eval_config
from agentrl.driver.difficulty import DifficultyFilter, fold_profile, profile_seed
from agentrl.commands.profile import profile_overrides
from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.tasks import SkipSet, TaskSource
from agentrl.types import Episode, EpisodeRequest, TerminationReason, Turn

IDS = ["a", "b", "c", "d"]


def _cfg(*overrides: str):
    return load_config(None, ["env.id=agentrl/GuessNumber-v0", "env.difficulty_filter=skip_solved_and_unsolved",
                              "env.profile_samples=2", "run.seed=5", *overrides])


@pytest.mark.parametrize("override, needle", [
    ("env.profile_samples=1", "env.profile_samples=1"),
    ("env.profile_every=-1", "env.profile_every=-1"),
])
def test_bad_filter_settings_are_config_errors_naming_the_values(override, needle):
    with pytest.raises(ConfigError) as err:
        _cfg(override)
    assert needle in str(err.value)
    with pytest.raises(ConfigError, match=r"env.difficulty_filter='sometimes'.*'off'"):
        load_config(None, ["env.difficulty_filter=sometimes"])
    load_config(None, ["controller.mode=async"])  # the filter off (the default): async is fine
    assert _cfg("controller.mode=async").env.difficulty_filter == "skip_solved_and_unsolved"  # and on (stream_source)


def test_a_run_profiles_at_its_start_then_every_n_iterations_and_resumes_without_an_extra_profile():
    once, every2 = DifficultyFilter(_cfg(), IDS), DifficultyFilter(_cfg("env.profile_every=2"), IDS)
    src = TaskSource("e", IDS, seed=5, group_size=2)
    assert once.due(src, 1) and every2.due(src, 1)  # no profile yet
    src.set_skip({"a"}, policy_version=0, iteration=1)
    assert not once.due(src, 1) and not any(once.due(src, it) for it in range(2, 10))  # profile_every 0: once
    assert [it for it in range(1, 10) if every2.due(src, it)] == [3, 5, 7, 9]
    resumed = TaskSource("e", IDS, seed=5, group_size=2)
    resumed.load_state_dict(src.state_dict())  # a checkpoint after iteration 1 or 2
    assert not every2.due(resumed, 2) and every2.due(resumed, 3)
    off = DifficultyFilter(load_config(None, ["env.id=agentrl/GuessNumber-v0"]), IDS)
    assert not off.due(TaskSource("e", IDS, seed=5, group_size=2), 1)


class _Pool:
    """Hands back one scored episode per request: success where ``solves(task, index)``."""

    def __init__(self, solves):
        self.solves, self.calls = solves, []

    def rollout(self, requests: list[EpisodeRequest], policy_version: int, budget=None):
        self.calls.append((requests, policy_version, budget))
        out = []
        for r in requests:
            ok = self.solves(r.task_id, r.index)
            turn = Turn(prompt_ids=[1], completion_ids=[2, 3, 4], behavior_log_probs=[-0.1] * 3, reward=float(ok),
                        policy_versions=[policy_version] * 3)
            out.append(Episode(group_id=r.group_id, env_id=r.env_id, task_id=r.task_id, seed=r.seed, turns=[turn],
                               terminated=True, termination_reason=TerminationReason.ENV_TERMINATED,
                               episode_id=r.episode_id))
        return out, 0.0, {}


class _Store:
    def __init__(self):
        self.added = []

    def add_episodes(self, run_id, iteration, episodes, advantages=None, *, kind="train", trainer_values=None):
        self.added.append((run_id, iteration, len(episodes), kind))
        return len(episodes)


def test_the_profile_sets_the_skip_set_stores_its_episodes_and_file_and_counts_its_tokens(tmp_path):
    cfg = _cfg("env.profile_samples=3")
    f = DifficultyFilter(cfg, IDS)
    src = TaskSource(cfg.env.id, IDS, cfg.run.seed, 2, run_id="run-1")
    # a: never solved, b: always, c: sample 0 only, d: samples 1 and 2
    pool, store = _Pool(lambda t, i: t == "b" or (t == "c" and i == 0) or (t == "d" and i > 0)), _Store()
    m = f.profile(pool, store, tmp_path, "run-1", 3, 2, src)
    requests, version, budget = pool.calls[0]
    assert version == 2 and budget is None  # the run's own rollout budget
    assert len(requests) == 12 and {r.task_id for r in requests} == set(IDS)
    assert all(r.episode_id.startswith("run-1/profile/it3/") for r in requests)
    train_seeds = {r.sample_seed for r in TaskSource(cfg.env.id, IDS, cfg.run.seed, 3).next_requests(4)}
    assert not train_seeds & {r.sample_seed for r in requests}  # not the training's own samples
    assert src.skip == SkipSet(("a", "b"), policy_version=2, iteration=3)
    assert store.added == [("run-1", 3, 12, "profile")]
    saved = json.loads((tmp_path / "profiles" / "iter_3.json").read_text())
    assert saved["seed"] == profile_seed(5, 3) and saved["policy_version"] == 2 and saved["iteration"] == 3
    assert [t["task_id"] for t in saved["tasks"]] == IDS and saved["budget"]["max_new_tokens"] == cfg.rollout.max_new_tokens
    assert m["profile/skipped_tasks"] == 2 and m["profile/fallback_all"] == 0 and m["tokens/profile_generated"] == 36
    credit = {"tokens/generated": 100.0, "tokens/trained": 70.0, "tokens/discarded": 30.0}
    fold_profile(credit, m)
    assert credit["tokens/generated"] == 136.0 and credit["tokens/discarded"] == 66.0
    assert credit["tokens/generated"] == credit["tokens/trained"] + credit["tokens/discarded"]
    assert credit["profile/mixed_tasks"] == 2
    untouched = dict(credit)
    fold_profile(credit, {})  # no profile this iteration
    assert credit == untouched


def test_a_profile_that_would_skip_every_task_trains_on_all_of_them(tmp_path, caplog):
    cfg = _cfg()
    src = TaskSource(cfg.env.id, IDS, cfg.run.seed, 2)
    with caplog.at_level("WARNING"):
        m = DifficultyFilter(cfg, IDS).profile(_Pool(lambda t, i: t in ("a", "b")), _Store(), tmp_path, "r", 0, 0, src)
    assert m["profile/fallback_all"] == 1 and m["profile/skipped_tasks"] == 0
    assert src.skip == SkipSet((), policy_version=0, iteration=0)
    assert "all 4 tasks have pass rate 0 or 1" in caplog.text and "2 never solved, 2 always solved" in caplog.text
    assert {r.task_id for r in src.next_requests(4)} == set(IDS)


def test_agentrl_tasks_profile_is_an_eval_with_the_rollout_budget():
    base = load_config(None, ["rollout.max_new_tokens=24", "rollout.max_turns=2", "rollout.temperature=0.7"])
    ov = profile_overrides(base, split="train", samples=3, seed=11, num_tasks=2)
    cfg, train_cfg = eval_config(EvalTarget("model", "tiny-random-smollm2", "tiny", 0, "tiny-random-smollm2"),
                                 ["rollout.max_new_tokens=24", "rollout.max_turns=2", "rollout.temperature=0.7", *ov])
    assert train_cfg is None
    assert (cfg.rollout.max_new_tokens, cfg.rollout.max_turns, cfg.rollout.temperature) == (24, 2, 0.7)
    assert (cfg.eval.split, cfg.eval.samples, cfg.eval.seed, cfg.eval.num_tasks, cfg.env.group_size) == ("train", 3, 11, 2, 3)
    assert cfg.rollout.max_context_tokens == base.rollout.max_context_tokens


def test_the_cli_reports_a_missing_target_and_a_bad_override_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli import app

    res = CliRunner().invoke(app, ["tasks", "profile", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "does not exist" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["tasks", "profile", "tiny-random-smollm2", "rollout.max_turns=0"])
    assert res.exit_code == 2 and "rollout.max_turns=0" in res.output and "Traceback" not in res.output


def test_a_config_that_evaluates_during_training_still_profiles_with_a_lower_rollout_context(tmp_path):
    """A run that evaluated before training (eval.max_context_tokens 2048) profiled with
    rollout.max_context_tokens=512: the training-eval check would refuse that config, but a
    profile trains nothing; the eval config gets the rollout's limits and the run's seed."""
    from agentrl.commands.evaluate import resolve_target
    from agentrl.commands.profile import profile_eval_overrides

    run = tmp_path / "run"
    (run / "checkpoints" / "iter_1" / "trainer").mkdir(parents=True)
    (run / "config.yaml").write_text("run:\n  name: r\n  seed: 9\nenv:\n  id: agentrl/GuessNumber-v0\n"
                                     "eval:\n  before_training: true\n  max_context_tokens: 2048\n")
    (run / "checkpoints" / "iter_1" / "controller.json").write_text(json.dumps({"run_id": "r-1", "iteration": 1,
                                                                               "policy_version": 1}))
    (run / "checkpoints" / "iter_1" / "trainer" / "COMPLETE").write_text("ok\n")
    (run / "checkpoints" / "latest").write_text("iter_1")
    with pytest.raises(ConfigError, match="eval.max_context_tokens=2048 exceeds rollout.max_context_tokens=512"):
        load_config(run / "config.yaml", ["rollout.max_context_tokens=512"])
    target = resolve_target(str(run))
    ov, base = profile_eval_overrides(target, ["rollout.max_context_tokens=512"], samples=2)
    cfg, _ = eval_config(target, ov)
    assert base.run.seed == 9 and (cfg.eval.seed, cfg.eval.samples, cfg.eval.split) == (9, 2, "train")
    assert cfg.rollout.max_context_tokens == 512 and not cfg.eval.before_training


def test_a_run_resumed_with_the_filter_off_stops_skipping(caplog):
    """``--resume RUN env.difficulty_filter=off`` (in either controller mode, through
    ``DifficultyFilter.restored`` in the controller, before either mode's loop; with the filter on
    it stays, tests/unit/driver/test_async_profile.py): the checkpoint's skip set is dropped (with a warning) before the next requests, so the task order is the unfiltered one, as the filter
    off promises, not the checkpoint's skip set for the rest of the run."""
    src = TaskSource("e", IDS, seed=5, group_size=1)
    src.set_skip({"a", "b"}, policy_version=0, iteration=0)
    resumed = TaskSource("e", IDS, seed=5, group_size=1)
    resumed.load_state_dict(src.state_dict())  # the checkpoint of a run that filtered
    unfiltered = TaskSource("e", IDS, seed=5, group_size=1)
    unfiltered.load_state_dict({k: v for k, v in src.state_dict().items() if k != "skip"})
    off = DifficultyFilter(load_config(None, ["env.id=agentrl/GuessNumber-v0"]), IDS)
    with caplog.at_level("WARNING"):
        off.restored(resumed, 3)
    assert resumed.skip is None and "difficulty_filter is off" in caplog.text
    assert [r.task_id for r in resumed.next_requests(8)] == [r.task_id for r in unfiltered.next_requests(8)]
    assert resumed.state_dict() == unfiltered.state_dict()
