"""``agentrl diagnose``'s hard-vs-wrong check on ``hub/ReasoningGym-v0``'s replies: the final
answer it compares is the content of the reply's last ``<answer>...</answer>`` (the one the env
scores), so samples that reason differently and agree on one answer the family's scorer
rejects are a likely wrong reference, a task with one success in four is hard, and different
wrong answers are unsolved. The replies are scored by the real env (reasoning-gym's scorers)."""

from __future__ import annotations

import pytest

from agentrl.hubs.reasoning_gym import ENV_ID, ReasoningGymEnv
from agentrl.replay.diagnose.answers import normalize_answer
from agentrl.replay.diagnose.data import EpisodeFacts
from agentrl.replay.diagnose.tasks import classify_tasks
from agentrl.types import TerminationReason

pytest.importorskip("reasoning_gym")

KWARGS = {"families": {"spell_backward": 1, "basic_arithmetic": 1}, "size": 2}


def _facts(env: ReasoningGymEnv, task_id: str, replies: list[str]) -> list[EpisodeFacts]:
    """One scored single-turn episode per reply, as ``load_run`` reads it from the store."""
    out = []
    for i, reply in enumerate(replies):
        env.reset(options={"task_id": task_id})
        _, reward, terminated, _, info = env.step(reply)
        assert terminated and info["final_answer"] is not None
        out.append(EpisodeFacts(
            episode_id=f"run/it1/{task_id}/{i}", iteration=1, group_id=f"run/it1/{task_id}", env_id=ENV_ID,
            task_id=task_id, kind="train", reward=reward, success=bool(info["success"]),
            termination=TerminationReason.ENV_TERMINATED, num_turns=1, response_tokens=len(reply.split()),
            response_chars=len(reply), finish_reasons=("stop",), tool_calls=0, answer=normalize_answer(reply),
            trained=True, policy_version_min=0, last_action_chars=len(reply)))
    return out


@pytest.mark.parametrize("family", ["spell_backward", "basic_arithmetic"])
def test_the_hard_vs_wrong_check_reads_the_answer_the_env_scores(family):
    env = ReasoningGymEnv(**KWARGS)
    task_id = next(t for t in ReasoningGymEnv.task_ids("train", env_kwargs=KWARGS) if t.startswith(family))
    env.reset(options={"task_id": task_id})
    right, wrong = str(env.entry["answer"]), ("zzzq" if family == "spell_backward" else "-7777")
    # four replies that reason differently (and hold other numbers), each classed on its own
    openings = ["Let me think.", "First 1 step, then 2 more.", "Reading it backwards, 3 letters at a time:", "Sure."]
    cases = {
        "wrong_reference": [f"{o}\n<answer>{wrong}</answer>" for o in openings],  # one answer, scored wrong
        "hard": [f"{openings[0]} <answer>{right}</answer>"] + [f"{o} <answer>{wrong}{i}</answer>"
                                                               for i, o in enumerate(openings[1:])],
        "unsolved": [f"{o} <answer>{wrong}{i}</answer>" for i, o in enumerate(openings)],
    }
    for verdict, replies in cases.items():
        facts = _facts(env, task_id, replies)
        (v,) = classify_tasks(facts)
        assert v.verdict == verdict, (verdict, [(e.answer, e.reward) for e in facts])
        assert v.successes == (1 if verdict == "hard" else 0) and v.samples == 4
        if verdict == "wrong_reference":
            assert v.agreed_answer == normalize_answer(wrong) and v.agree_frac == 1.0


def test_the_answer_is_the_tag_content_whole():
    assert normalize_answer("3 of 4 parts, so <answer>3/4</answer>") == "3/4"  # not the last number
    assert normalize_answer("<answer>12</answer> (from 5 and 7)") == "12"
    assert normalize_answer("Thinking... <ANSWER> Olleh </Answer>") == "olleh"
    assert normalize_answer("<answer>\\boxed{2}</answer>") == "2"
    assert normalize_answer("no closing tag <answer>7") == "7"  # no complete pair: the last number, as before
