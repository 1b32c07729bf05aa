"""``agentrl diagnose``'s checks on runs written through the replay store's writer: each
symptom made on purpose fires its check and not the others; task classes (likely wrong
reference apart from hard); answer normalisation; the CLI's JSON, exit codes and errors."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from agentrl.errors import ContractError
from agentrl.replay import ReplayStore
from agentrl.replay.diagnose import diagnose, episode_link, normalize_answer
from agentrl.replay.diagnose.checks import spearman
from agentrl.types import Episode, TerminationReason, Turn

ALL = {"reward_flat", "constant_judge", "wrong_reference", "train_up_eval_flat", "answers_converging",
       "length_growth", "reward_pays_length", "update_spikes", "stale_async"}


def ep(run, it, task, g, i, *, reward, text, n_tokens=4, success=None, version=0, finish="stop"):
    e = Episode(group_id=f"{run}/it{it}/{task}@{g}", env_id="t/Env-v0", task_id=task, seed=g,
                episode_id=f"{run}/it{it}/{task}@{g}/{i}", success=success,
                termination_reason=TerminationReason.LENGTH if finish == "length" else TerminationReason.ENV_TERMINATED,
                terminated=finish != "length", truncated=finish == "length")
    e.turns.append(Turn(prompt_ids=[1, 2], completion_ids=list(range(5, 5 + n_tokens)),
                        behavior_log_probs=[-1.0] * n_tokens, policy_version=version, finish_reason=finish,
                        reward=reward, action_text=text))
    return e


class Run:
    def __init__(self, store: ReplayStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        store.start_run(run_id, {"kind": "train"})

    def add(self, it, eps, metrics=None, trainer=None):
        self.store.add_episodes(self.run_id, it, eps, {e.episode_id: [0.1] * len(e.turns) for e in eps},
                                trainer_values=trainer)
        self.store.add_metrics(self.run_id, it, {"policy_version": float(it + 1), **(metrics or {})})


@pytest.fixture
def store(tmp_path):
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as s:
        yield s


def words(rng, n=3):
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]) for _ in range(n))


def healthy(run_id, it, rng, tasks=("a", "b", "c"), groups=2, size=4):
    """Groups with mixed outcomes, different answers, length unrelated to reward."""
    out = []
    for t in tasks:
        for g in range(groups):
            for i in range(size):
                win = (i + g) % 2 == 0
                out.append(ep(run_id, it, t, g, i, reward=1.0 if win else 0.0, success=win,
                              text=words(rng), n_tokens=rng.choice([3, 9, 5, 7])))
    return out


def test_healthy_run_fires_nothing(store):
    rng = random.Random(0)
    r = Run(store, "ok")
    for it in range(2):
        r.add(it, healthy("ok", it, rng), {"rollout/reward_mean": 0.5})
    d = diagnose(store, "ok")
    assert d.fired() == [], [d.finding(c).summary for c in d.fired()]
    assert d.episodes == 48 and d.iterations == 2
    flat = d.finding("reward_flat")
    assert flat.numbers["zero_variance_group_frac"] == 0.0 and flat.numbers["groups"] == 12
    assert {t.verdict for t in d.tasks} == {"ok"}


def test_constant_judge(store):
    rng = random.Random(1)
    r = Run(store, "cj")
    r.add(0, [ep("cj", 0, t, g, i, reward=0.5, text=words(rng)) for t in "abc" for g in range(2) for i in range(4)])
    d = diagnose(store, "cj")
    assert set(d.fired()) == {"constant_judge", "reward_flat"}  # the cause, and the symptom it makes
    f = d.finding("constant_judge")
    assert f.tasks == ["a", "b", "c"]
    assert f.numbers["constant_tasks"]["a"]["reward"] == 0.5 and f.numbers["constant_tasks"]["a"]["distinct_answers"] >= 4
    assert f.examples and f.thresholds["min_distinct_answers"] == 4
    assert d.finding("reward_flat").numbers["zero_variance_constant"] == 6


def test_all_zero_is_flat_not_a_constant_judge(store):
    rng = random.Random(2)
    r = Run(store, "zero")
    r.add(0, [ep("zero", 0, t, g, i, reward=0.0, success=False, text=words(rng, 4))
              for t in "abc" for g in range(2) for i in range(4)])
    d = diagnose(store, "zero")
    assert d.fired() == ["reward_flat"]
    assert d.finding("reward_flat").numbers["zero_variance_all_fail"] == 6
    assert {t.verdict for t in d.tasks} == {"unsolved"}


def test_wrong_reference_apart_from_hard(store):
    rng = random.Random(3)
    r = Run(store, "wr")
    eps = healthy("wr", 0, rng, tasks=("fine",))
    # every sample answers 42 in its own words; the judge rejects them all
    eps += [ep("wr", 0, "wrong", g, i, reward=0.0, success=False, text=f"{words(rng)} so the answer: 42.")
            for g in range(2) for i in range(4)]
    # one success in eight, answers disagree: hard, not wrong
    eps += [ep("wr", 0, "hard", g, i, reward=float(g == 0 and i == 0), success=g == 0 and i == 0,
               text=words(rng, 5)) for g in range(2) for i in range(4)]
    r.add(0, eps)
    d = diagnose(store, "wr")
    assert "wrong_reference" in d.fired()
    assert not {"constant_judge", "reward_pays_length", "stale_async"} & set(d.fired())
    f = d.finding("wrong_reference")
    assert f.tasks == ["wrong"]
    assert f.numbers["likely_wrong_reference"]["wrong"] == {"samples": 8, "agreed_answer": "42", "agree_frac": 1.0}
    assert f.numbers["hard"] == {"hard": {"samples": 8, "successes": 1}}
    verdicts = {t.task_id: t.verdict for t in d.tasks}
    assert verdicts == {"fine": "ok", "hard": "hard", "wrong": "wrong_reference"}
    assert f.examples[0].startswith("wr/it0/wrong@")


def test_reward_that_pays_for_length(store):
    rng = random.Random(4)
    r = Run(store, "len")
    for it in range(2):
        eps = []
        for t in "ab":
            for g in range(2):
                for i in range(4):
                    n = rng.randint(2, 30) + 10 * it
                    eps.append(ep("len", it, t, g, i, reward=min(1.0, n / 40), text=words(rng, n),
                                  n_tokens=n, finish="length" if n > 30 else "stop"))
        r.add(it, eps)
    d = diagnose(store, "len")
    assert {"reward_pays_length", "length_growth"} <= set(d.fired())
    assert not {"constant_judge", "wrong_reference", "stale_async"} & set(d.fired())
    f = d.finding("reward_pays_length")
    assert f.tasks == ["a", "b"] and all(v["spearman"] >= 0.7 for v in f.numbers["tasks"].values())
    buckets = d.finding("length_growth").numbers["buckets"]
    assert sum(b["episodes"] for b in buckets.values()) == 32
    last = list(buckets.values())[-1]
    assert last["truncation_rate"] > 0 and set(last) == {"episodes", "truncation_rate", "eos_rate", "tool_loop_rate"}


def test_stale_async_buffer(store):
    """Iteration 1 trains samples of versions 1 (fresh) and 0 (one update old): the trainer's
    log-probs differ from the engine's far more on the stale ones."""
    rng = random.Random(5)
    r = Run(store, "async")
    r.add(0, healthy("async", 0, rng))
    eps = healthy("async", 1, rng, tasks=("a", "b", "c", "d"))
    for e in eps:
        e.turns[0].policy_version = 1 if e.task_id in "ab" else 0
        e.turns[0].policy_versions = [e.turns[0].policy_version] * len(e.turns[0].completion_ids)
    trainer = {e.episode_id: [([-1.0 - (0.001 if e.task_id in "ab" else 0.3)] * len(e.turns[0].completion_ids),
                               [2.0] * len(e.turns[0].completion_ids))] for e in eps}
    r.add(1, eps, {"async/staleness_max": 1.0, "async/stale_dropped": 0.0}, trainer)
    d = diagnose(store, "async")
    assert "stale_async" in d.fired()
    assert not {"constant_judge", "wrong_reference", "reward_pays_length"} & set(d.fired())
    n = d.finding("stale_async").numbers
    assert n["buckets"]["0"]["episodes"] == 24 + 16 and n["buckets"]["1"]["episodes"] == 16
    assert n["stale_gap_abs_mean"] == pytest.approx(0.3) and n["async_staleness_max"] == 1.0


def test_update_spike_names_its_iteration(store):
    rng = random.Random(6)
    r = Run(store, "spike")
    for it in range(6):
        r.add(it, healthy("spike", it, rng, tasks=("a",), groups=1),
              {"actor/pg_loss": 50.0 if it == 4 else 0.1 + 0.01 * it, "actor/ratio_mean": 1.0})
    d = diagnose(store, "spike")
    f = d.finding("update_spikes")
    assert f.fired and f.numbers["actor/pg_loss"]["worst_iteration"] == 4
    assert all(e.startswith("spike/it4/") for e in f.examples)


def test_train_up_eval_flat_and_converging(store):
    r = Run(store, "conv")
    for it in range(3):
        # answers collapse onto one within every group; entropy falls; train reward rises, eval does not
        eps = [ep("conv", it, t, g, i, reward=float(i < 1 + it), success=i < 1 + it,
                  text="same" if it == 2 or i == 0 else f"w{i}{g}{t}") for t in "ab" for g in range(2) for i in range(4)]
        r.add(it, eps, {"rollout/reward_mean": 0.25 * (1 + it), "eval/pass@1": 0.3, "actor/entropy": 2.0 / (1 + it)})
    d = diagnose(store, "conv")
    assert {"train_up_eval_flat", "answers_converging"} <= set(d.fired())
    assert d.finding("answers_converging").numbers["agreement_by_iteration"] == {"0": 0.25, "1": 0.25, "2": 1.0}


def test_normalize_answer():
    assert normalize_answer("so \\boxed{ 7 } it is") == "7"
    assert normalize_answer("Answer: Paris.") == "paris"
    assert normalize_answer("first 3 then 4.0") == "4"
    assert normalize_answer("  Hello   World ") == "hello world"
    assert normalize_answer("") == ""


def test_spearman_and_links():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert episode_link("r/it0/t@0/1", "http://h:1/") == "http://h:1/episode?id=r%2Fit0%2Ft%400%2F1"


def test_unknown_run_is_a_clear_error(store):
    Run(store, "x")
    with pytest.raises(ContractError, match=r"run 'nope' is not in .*runs there: x"):
        diagnose(store, "nope")


def test_cli_json_and_exit_codes(tmp_path):
    from agentrl.cli import app

    url = f"sqlite:///{tmp_path / 'replay.db'}"
    rng = random.Random(7)
    with ReplayStore(url) as s:
        r = Run(s, "cj")
        r.add(0, [ep("cj", 0, t, g, i, reward=0.5, text=words(rng)) for t in "abc" for g in range(2) for i in range(4)])
    runner = CliRunner()
    res = runner.invoke(app, ["diagnose", str(tmp_path / "replay.db"), "--json", "--base-url", "http://v:9"])
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["run_id"] == "cj" and "constant_judge" in out["fired"]
    cj = next(f for f in out["findings"] if f["check"] == "constant_judge")
    assert cj["links"][0].startswith("http://v:9/episode?id=cj%2Fit0%2F")
    assert {f["check"] for f in out["findings"]} == ALL
    text = runner.invoke(app, ["diagnose", str(tmp_path), "--run", "cj"])  # a run directory
    assert text.exit_code == 1 and "constant_judge" in text.stdout and "FIRES" in text.stdout
    bad = runner.invoke(app, ["diagnose", str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "does not exist" in bad.output


def _spike_run(store, run_id, series):
    rng = random.Random(8)
    r = Run(store, run_id)
    for it, m in enumerate(series):
        r.add(it, healthy(run_id, it, rng, tasks=("a",), groups=1), m)
    return diagnose(store, run_id).finding("update_spikes")


def test_float_noise_on_a_flat_metric_is_no_spike(store):
    """``actor/ratio_mean`` 1.0 with one 1.0000001, ``pg_loss`` 0 with one 1e-6 (the default
    run's zero-variance groups): a MAD of 0 must not turn noise into a spike."""
    f = _spike_run(store, "noise", [{"actor/ratio_mean": 1.0000001 if it == 3 else 1.0,
                                     "actor/pg_loss": 1e-6 if it == 2 else 0.0} for it in range(6)])
    assert not f.fired, f.summary
    assert f.numbers["actor/ratio_mean"]["mads"] < 1 and f.numbers["actor/pg_loss"]["mads"] < 1
    assert f.numbers["actor/pg_loss"]["mad"] == 1e-3 and f.thresholds["spike_rel_floor"] == 0.01


def test_a_downward_spike_fires(store):
    """``pg_loss`` -5.0 among ~0.1: a deviation below the median counts as one above does."""
    f = _spike_run(store, "down", [{"actor/pg_loss": -5.0 if it == 3 else 0.1 + 0.01 * (it % 2)} for it in range(6)])
    assert f.fired and f.numbers["actor/pg_loss"]["worst_iteration"] == 3 and f.numbers["actor/pg_loss"]["worst"] == -5.0
    assert all(e.startswith("down/it3/") for e in f.examples)


def test_full_marks_for_different_answers_is_a_constant_judge(store):
    """A judge that always gives full marks (reward hacking): every sample succeeds with 1.0
    while their final answers differ; a task whose passing samples agree is easy, not flagged."""
    rng = random.Random(9)
    r = Run(store, "full")
    eps = [ep("full", 0, "hacked", g, i, reward=1.0, success=True, text=words(rng, 4)) for g in range(2) for i in range(4)]
    eps += [ep("full", 0, "easy", g, i, reward=1.0, success=True, text=f"{words(rng)} answer: 7") for g in range(2)
            for i in range(4)]
    eps += healthy("full", 0, rng, tasks=("fine",))
    r.add(0, eps)
    d = diagnose(store, "full")
    f = d.finding("constant_judge")
    assert f.fired and f.tasks == ["hacked"], f.summary
    assert f.numbers["constant_tasks"]["hacked"]["all_success"] is True and "full marks" in f.summary
    assert f.numbers["constant_tasks"]["easy"]["distinct_answers"] == 1
    assert {t.task_id: t.verdict for t in d.tasks}["easy"] == "easy"


def test_full_marks_for_different_programs_is_no_constant_judge(store):
    """Different programs can all pass (an easy HumanEval task): full marks over answers longer
    than a final answer is not called a constant judge; a constant 0.5 over them still is."""
    rng = random.Random(10)
    r = Run(store, "code")
    def program(i: int) -> str:
        return f"def add(a, b):\n    total = a\n    for _ in range({i}):\n        pass\n    return total + b  # variant {i}"
    eps = [ep("code", 0, "easy_code", g, i, reward=1.0, success=True, text=program(4 * g + i)) for g in range(2)
           for i in range(4)]
    eps += [ep("code", 0, "half_code", g, i, reward=0.5, success=False, text=program(10 + 4 * g + i)) for g in range(2)
            for i in range(4)]
    eps += healthy("code", 0, rng, tasks=("fine",))
    r.add(0, eps)
    f = diagnose(store, "code").finding("constant_judge")
    assert f.numbers["constant_tasks"]["easy_code"]["distinct_answers"] == 8
    assert f.fired and f.tasks == ["half_code"], f.summary


def test_samples_cut_by_the_token_limit_are_no_agreement(store):
    """Samples cut by max_new_tokens gave no final answer: the "last number" of a cut text
    (here all "3") is not agreement, so the task is unsolved, not a wrong reference; with the
    same text ending on its own it would be one."""
    r = Run(store, "cut")
    eps = [ep("cut", 0, "cut", g, i, reward=0.0, success=False, text=f"step {i} of 3", finish="length")
           for g in range(2) for i in range(4)]
    eps += [ep("cut", 0, "done", g, i, reward=0.0, success=False, text=f"step {i} of 3") for g in range(2) for i in range(4)]
    # a task with a few cut samples: agreement is over those that answered
    eps += [ep("cut", 0, "some", g, i, reward=0.0, success=False, text="answer: 42" if i else "rambling 3",
               finish="stop" if i else "length") for g in range(2) for i in range(4)]
    r.add(0, eps)
    d = diagnose(store, "cut")
    verdicts = {t.task_id: t for t in d.tasks}
    assert verdicts["cut"].verdict == "unsolved" and verdicts["cut"].answered == 0 and verdicts["cut"].agree_frac == 0.0
    assert verdicts["done"].verdict == "wrong_reference" and verdicts["done"].agreed_answer == "3"
    assert (verdicts["some"].verdict, verdicts["some"].answered, verdicts["some"].agree_frac) == ("wrong_reference", 6, 1.0)
    assert d.finding("wrong_reference").tasks == ["done", "some"]
