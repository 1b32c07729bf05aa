"""``agentrl/MathAnswer-v0``: the data file, the splits, the answer extraction, the plain rule
checker (its misses, and its accuracy on the labelled answers), the reset/step contract and
the checker."""

from __future__ import annotations

import importlib.resources
import json

import pytest

import environments
from agentrl.errors import ConfigError, EnvError
from agentrl.types import StepInfo
from environments.checker import check_env, format_report
from environments.math_answer import (
    ENV_ID,
    MathAnswerEnv,
    extract_answer,
    load_tasks,
    rule_equivalent,
    split_of,
)


def rule_accuracy(split: str) -> float:
    labelled = MathAnswerEnv.labelled_answers(split)
    hits = sum(rule_equivalent(MathAnswerEnv.get_task(tid).reference, answer) == equivalent
               for tid, answer, equivalent in labelled)
    return hits / len(labelled)


def test_the_data_file_loads_with_references_and_labels():
    raw = importlib.resources.files("environments").joinpath("data", "math_answer.jsonl").read_text(encoding="utf-8")
    assert len([json.loads(line) for line in raw.splitlines() if line.strip()]) == 120
    tasks = load_tasks()
    assert len(tasks) == 120 and [t.task_id for t in tasks] == [f"math/{i:03d}" for i in range(120)]
    for t in tasks:
        assert t.reference.strip() and t.question.strip() and len(t.answers) >= 3, t.task_id
        assert len({a.answer for a in t.answers}) == len(t.answers), t.task_id
    labels = [a.equivalent for t in tasks for a in t.answers]
    assert True in labels and False in labels
    assert {t.kind for t in tasks} == {"percent", "pi", "units", "scientific", "separators", "words", "fractions",
                                       "sqrt", "negative", "rounding", "word"}


def test_splits_are_disjoint_stable_and_cover_all():
    train, test = MathAnswerEnv.task_ids("train"), MathAnswerEnv.task_ids("test")
    assert (len(train), len(test)) == (90, 30) and not set(train) & set(test)
    assert sorted(train + test) == MathAnswerEnv.task_ids("all")
    assert test[:3] == ["math/003", "math/007", "math/011"] and train[:3] == ["math/000", "math/001", "math/002"]
    assert all(split_of(t) == "test" for t in test) and all(split_of(t) == "train" for t in train)
    assert {tid for tid, _, _ in MathAnswerEnv.labelled_answers("test")} == set(test)
    with pytest.raises(ConfigError, match="split='dev'"):
        MathAnswerEnv.task_ids("dev")
    with pytest.raises(ConfigError, match="math/NNN"):
        split_of("math/7")


@pytest.mark.parametrize("text, expected", [
    ("So it is 0.96.\nAnswer: 0.96", "0.96"),
    ("answer: 3\nwait, ANSWER:  96% \nthanks", "96%"),
    ("Working...\n\n  5 km  \n", "5 km"),
    ("Answer:", ""),
    ("", ""),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("reference, answer", [
    ("0.96", "96%"), ("0.96", "24/25"), ("π", "pi"), ("5 km", "5000 m"), ("12", "twelve"), ("1/2", "2/4"),
    ("√2", "sqrt(2)"), ("-5", "\u22125"), ("30000", "3e4"), ("5000", "5,000"),
])
def test_the_rule_misses_equivalent_forms(reference, answer):
    assert not rule_equivalent(reference, answer)


@pytest.mark.parametrize("reference, answer, expected", [
    ("0.96", " 0.96 ", True), ("0.96", "0.960", True), ("0.25", ".25", True), ("π", "Π", True), ("7", "+7", True),
    ("3.14", "3.1416", False), ("-5", "5", False), ("1230", "1230.0", True),
])
def test_the_rule_matches_strings_and_plain_decimals(reference, answer, expected):
    assert rule_equivalent(reference, answer) is expected
    assert MathAnswerEnv.rule_equivalent(reference, answer) is expected


def test_rule_accuracy_on_the_labelled_answers():
    for split in ("train", "test"):
        acc = rule_accuracy(split)
        print(f"rule checker accuracy on {split}: {acc:.3f} ({len(MathAnswerEnv.labelled_answers(split))} answers)")
        assert 0.4 < acc < 1.0
    # the rule only ever misses: no labelled non-equivalent answer passes it
    assert not [(tid, a) for tid, a, eq in MathAnswerEnv.labelled_answers("all")
                if not eq and rule_equivalent(MathAnswerEnv.get_task(tid).reference, a)]


def test_reset_and_step_expose_reference_and_answer():
    env = environments.make_env(ENV_ID).unwrapped
    obs, info = env.reset(seed=0, options={"task_id": "math/000"})
    assert "24 of 25" in obs and 'Answer: <answer>' in obs
    assert info["reference_answer"] == env.reference == "0.96"
    assert (info["task_id"], info["split"]) == ("math/000", "train")
    assert StepInfo.from_info(info, env_id=ENV_ID, where="reset").reference_answer == "0.96"
    assert info["anchor"] == ("math/000", 0) and env.final_answer is None and "Answer:" in info["system_prompt"]
    obs, r, term, trunc, info = env.step("24/25 = 0.96\nAnswer: 96%")
    assert (r, term, trunc, info["success"], info["invalid_action"]) == (0.0, True, False, False, False)
    assert info["final_answer"] == env.final_answer == "96%" and "96%" in obs
    assert StepInfo.from_info(info, env_id=ENV_ID).final_answer == "96%"
    with pytest.raises(EnvError, match="ended"):
        env.step("Answer: 0.96")
    env.reset(options={"task_id": "math/000"})
    assert env.final_answer is None
    _, r, term, _, info = env.step("Answer: 0.960")
    assert r == 1.0 and term and info["success"] and info["final_answer"] == "0.960"
    env.reset(options={"task_id": "math/001"})
    _, r, _, _, info = env.step("   ")
    assert r == 0.0 and info["invalid_action"] and info["final_answer"] == "" and not info["success"]
    with pytest.raises(ConfigError, match="math/999"):
        env.reset(options={"task_id": "math/999"})


def test_reset_without_a_task_draws_from_its_split():
    env = MathAnswerEnv(split="test")
    drawn = {env.reset(seed=s)[1]["task_id"] for s in range(20)}
    assert drawn <= set(MathAnswerEnv.task_ids("test")) and len(drawn) > 1
    assert env.reset(seed=3)[0] == env.reset(seed=3)[0]
    with pytest.raises(ConfigError, match="render_mode"):
        MathAnswerEnv(render_mode="human")


def test_passes_the_env_checker():
    assert ENV_ID in environments.registered_env_ids()
    assert environments.env_class(ENV_ID).uses_sandbox is False
    report = check_env(ENV_ID)
    assert report.ok, format_report(report)
    assert report.checks_passed == ["task_ids", "make", "reset", "step", "done", "determinism", "independence",
                                    "close"]
    assert report.notes == [] and report.steps == 1
