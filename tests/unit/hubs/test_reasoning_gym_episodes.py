"""``hub/ReasoningGym-v0``'s episodes: a scripted policy that answers each item's reference
scores 1.0 on five families, single-turn scoring, the multi-turn mode's feedback and step
rewards, the env checker, and a generator failure as an error (scorer failures:
test_reasoning_gym_isolation.py)."""

from __future__ import annotations

import pytest

import agentrl.hubs
from agentrl.errors import EnvError
from agentrl.hubs.reasoning_gym import ENV_ID, STOP_STRING, ReasoningGymEnv, _dataset
from agentrl.types import StepInfo
from environments.checker import check_env, format_report

pytest.importorskip("reasoning_gym")

FIVE = ["basic_arithmetic", "countdown", "spell_backward", "word_sorting", "mini_sudoku"]


def _right(env: ReasoningGymEnv) -> str:
    return f"Let me think it over.\n<answer>{env.entry['answer']}</answer>"


def test_a_scripted_policy_answering_the_reference_scores_1_on_five_families():
    kw = {"families": FIVE, "size": 3}
    env = ReasoningGymEnv(**kw)
    for split in ("train", "test"):
        ids = ReasoningGymEnv.task_ids(split, env_kwargs=kw)
        assert {t.split("/")[0] for t in ids} == set(FIVE)
        for task_id in ids:
            obs, info = env.reset(options={"task_id": task_id})
            step = StepInfo.from_info(info, env_id=ENV_ID)
            assert obs.startswith(env.entry["question"]) and step.reference_answer == env.entry["answer"]
            assert step.anchor == (task_id, 0) and "<answer>" in step.system_prompt
            assert step.stop_strings == (STOP_STRING,)
            _, reward, terminated, truncated, info = env.step(_right(env))
            step = StepInfo.from_info(info, env_id=ENV_ID)
            assert (reward, terminated, truncated, step.success) == (1.0, True, False, True), task_id
            assert step.final_answer == env.entry["answer"].strip() and info["score"] == 1.0


def test_single_turn_scores_with_the_familys_own_scorer():
    env = ReasoningGymEnv(families="countdown", size=5)
    env.reset(options={"task_id": "countdown/s0/1"})
    obs, reward, terminated, _, info = env.step("<answer>1 + 1</answer>")
    # countdown's scorer gives a little for a well-formed wrong expression: partial credit, not success
    assert 0 < reward < 1 and terminated and info["success"] is False and "No attempts left" in obs
    env.reset(options={"task_id": "countdown/s0/1"})
    obs, reward, terminated, _, info = env.step("the answer is 42")  # no tags: the model's format fault
    assert (reward, terminated, info["invalid_action"], info["final_answer"]) == (0.0, True, True, "")
    env.reset(options={"task_id": "countdown/s0/1"})
    assert env.step("<answer>  </answer>")[4]["invalid_action"]
    with pytest.raises(EnvError, match="after the episode"):
        env.step("<answer>1</answer>")


def test_multi_turn_a_wrong_then_right_policy_gets_its_step_rewards():
    env = ReasoningGymEnv(families="spell_backward", size=5, attempts=3)
    obs, info = env.reset(options={"task_id": "spell_backward/s0/2"})
    assert "3 attempts" in info["system_prompt"]
    rewards, anchors = [], [info["anchor"]]
    obs, reward, terminated, truncated, info = env.step("<answer>wrong</answer>")
    rewards.append(reward)
    anchors.append(info["anchor"])
    assert not terminated and not truncated and "'wrong' is not correct" in obs and "2 attempts left" in obs
    assert env.entry["answer"] not in obs  # the feedback never gives the reference away
    assert info["stop_strings"] == [STOP_STRING] and "success" not in info and "final_answer" not in info
    obs, reward, terminated, truncated, info = env.step(_right(env))
    rewards.append(reward)
    anchors.append(info["anchor"])
    assert rewards == [0.0, 1.0] and terminated and not truncated and info["success"] is True and obs == "Correct."
    assert anchors == [("spell_backward/s0/2", 0), ("spell_backward/s0/2", 1), ("spell_backward/s0/2", 2)]
    assert info["attempt"] == 2


def test_multi_turn_rewards_the_gain_so_the_total_is_the_best_score():
    env = ReasoningGymEnv(families="spell_backward", size=5, attempts=4)
    env.reset(options={"task_id": "spell_backward/s0/0"})
    word = env.entry["answer"]
    partial = word[: len(word) // 2] + "#" * (len(word) - len(word) // 2)  # credit per letter in place
    steps = [env.step(f"<answer>{a}</answer>") for a in (partial, partial, "###", word)]
    scores = [s[4]["score"] for s in steps]
    rewards = [s[1] for s in steps]
    assert 0 < scores[0] == scores[1] < 1 and scores[2] == 0 and scores[3] == 1
    assert rewards == [scores[0], 0.0, 0.0, pytest.approx(1 - scores[0])] and sum(rewards) == pytest.approx(1.0)
    assert [s[2] for s in steps] == [False, False, False, True] and "score" in steps[0][0]
    env.reset(options={"task_id": "spell_backward/s0/0"})
    out = [env.step("no answer") for _ in range(4)]  # attempts run out: terminated (a rule of the game), lost
    assert [o[2] for o in out] == [False, False, False, True] and out[-1][4]["success"] is False
    assert "No attempts left" in out[-1][0] and sum(o[1] for o in out) == 0.0


@pytest.mark.parametrize("kwargs", [{}, {"families": {"gcd": 2, "spell_backward": 1}, "size": 5, "attempts": 3}])
def test_check_env_passes(kwargs):
    agentrl.hubs.register()
    report = check_env(ENV_ID, env_kwargs=kwargs)
    assert report.ok, format_report(report)
    assert report.checks_passed == ["task_ids", "make", "reset", "step", "done", "determinism", "independence",
                                    "close"]
    assert report.notes == []
    assert report.task_id == ReasoningGymEnv.task_ids("train", env_kwargs=kwargs)[0]


def test_a_generator_failure_is_an_env_error(monkeypatch):
    env = ReasoningGymEnv(families="gcd", size=5)
    ds, _ = _dataset("gcd", 0, 5, "{}")

    def broken(self, idx):
        raise RuntimeError("generator bug")

    monkeypatch.setattr(type(ds), "__getitem__", broken)
    with pytest.raises(EnvError, match=r"family 'gcd' failed to generate item 3 .*RuntimeError: generator bug"):
        env.reset(options={"task_id": "gcd/s0/3"})


def test_reasoning_gym_missing_is_a_config_error_saying_how_to_install(monkeypatch):
    import builtins

    from agentrl.errors import ConfigError

    real_import = builtins.__import__

    def no_rg(name, *args, **kwargs):
        if name == "reasoning_gym" or name.startswith("reasoning_gym."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_rg)
    with pytest.raises(ConfigError, match=r"pip install 'agentrl\[reasoning-gym\]'"):
        ReasoningGymEnv()
