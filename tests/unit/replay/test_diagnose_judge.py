"""``agentrl diagnose``'s judge checks (``agentrl.replay.diagnose.judge``) on runs written
through the replay store with judgements built to give known numbers: each check fires on the
fault made on purpose and not on a sound judge; a run without judgements, and a database of
schema 9 (no ``judgements`` table, opened read-only), say "no judgements" and fail nothing;
the CLI's report and ``--json`` carry the judge section."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.replay import ReplayStore
from agentrl.replay.diagnose import diagnose
from agentrl.replay.diagnose.checks import spearman
from agentrl.types import Episode, JudgeRecord, TerminationReason, Turn
from tests.helpers.replay_schema import downgrade

DIGEST = "a" * 64


def jep(run: str, it: int, i: int, *, score: float | None, rule: float | None = None, chars: int = 8,
        mode: str = "single", position: int | None = None, judged: bool = True, cached: bool = False,
        calls: int = 1, parse_errors: int = 0, latency_s: float = 0.5, error: str | None = None) -> Episode:
    """One training episode of ``run`` whose last action has ``chars`` characters, with a judgement."""
    reward = None if error else (rule if not judged else score)
    rec = JudgeRecord(model="judge-m", rubric="r", rubric_digest=DIGEST, mode=mode, score=score, rule_reward=rule,
                      reward=reward, latency_s=0.0 if cached or not judged else latency_s, cached=cached,
                      judged=judged, calls=calls if judged and not cached else 0, parse_errors=parse_errors,
                      group_position=position, error=error)
    e = Episode(group_id=f"{run}/it{it}/t@{i // 4}", env_id="t/Env-v0", task_id=f"t{i}", seed=i,
                episode_id=f"{run}/it{it}/t@{i}/0", terminated=True,
                termination_reason=TerminationReason.REWARD_ERROR if error else TerminationReason.ENV_TERMINATED,
                judgement=rec)
    e.turns.append(Turn(prompt_ids=[1, 2], completion_ids=[5, 6], behavior_log_probs=[-1.0, -1.0],
                        finish_reason="stop", reward=0.0 if reward is None else reward, action_text="x" * chars))
    return e


@pytest.fixture
def store(tmp_path):
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as s:
        yield s


def add(store: ReplayStore, run: str, by_it: dict[int, list[Episode]]) -> None:
    store.start_run(run, {"kind": "train"})
    for it, eps in by_it.items():
        store.add_episodes(run, it, eps)
        store.add_metrics(run, it, {"policy_version": float(it)})


def test_agreement_with_the_rule_and_rule_positive_rejections(store):
    """7/10 agree; the judge rejects 2 of 5 rule-positive answers (40 % > 10 %): fires. Rule-decided
    episodes (no judge call) are left out. A judge that rejects 1 of 10 (10 %, not above) does not fire."""
    pos, neg = [0.9, 0.8, 1.0, 0.2, 0.1], [0.1, 0.0, 0.3, 0.7, 0.2]
    eps = [jep("agree", 1, i, score=s, rule=1.0) for i, s in enumerate(pos)]
    eps += [jep("agree", 1, 5 + i, score=s, rule=0.0) for i, s in enumerate(neg)]
    eps += [jep("agree", 1, 10 + i, score=None, rule=1.0, judged=False) for i in range(3)]
    add(store, "agree", {1: eps})
    f = diagnose(store, "agree").finding("judge_rule_agreement")
    assert f.fired and f.status == "fires"
    assert f.numbers == {"episodes": 10, "agree": 7, "agreement": 0.7, "rule_positive": 5, "rule_positive_rejected": 2,
                         "reject_rate": 0.4, "rule_negative": 5, "rule_negative_accepted": 1}
    assert sorted(f.examples) == ["agree/it1/t@3/0", "agree/it1/t@4/0"]
    assert "7/10" in f.summary and "2/5" in f.summary

    add(store, "fine", {1: [jep("fine", 1, i, score=0.1 if i == 0 else 0.9, rule=1.0) for i in range(10)]})
    f = diagnose(store, "fine").finding("judge_rule_agreement")
    assert not f.fired and f.numbers["reject_rate"] == 0.1 and f.numbers["agree"] == 9

    # rule_first: only rule-negative answers reach the judge; agreement is measured, nothing to reject
    add(store, "rf", {1: [jep("rf", 1, i, score=0.8 if i < 2 else 0.0, rule=0.0) for i in range(6)]})
    f = diagnose(store, "rf").finding("judge_rule_agreement")
    assert f.status == "no" and f.numbers["rule_positive"] == 0 and f.numbers["reject_rate"] is None
    assert f.numbers["agree"] == 4 and "no rule-positive episode was judged" in f.summary


def test_length_bias(store):
    """Score rising with answer length over 20 episodes: rho 1.0, fires; a score unrelated to
    length: |rho| <= 0.3, does not; 19 scores: skipped."""
    add(store, "long", {1: [jep("long", 1, i, score=i / 19, chars=10 + i) for i in range(20)]})
    f = diagnose(store, "long").finding("judge_length_bias")
    assert f.fired and f.numbers["spearman"] == 1.0 and f.numbers["episodes"] == 20
    assert f.examples[0] == "long/it1/t@19/0"  # the longest, best-paid answer first

    scores = [0.9, 0.1, 0.2, 0.8] * 5
    add(store, "flat", {1: [jep("flat", 1, i, score=s, chars=10 + i) for i, s in enumerate(scores)]})
    f = diagnose(store, "flat").finding("judge_length_bias")
    rho = spearman([float(10 + i) for i in range(20)], scores)
    assert not f.fired and abs(rho) <= 0.3 and f.numbers["spearman"] == round(rho, 4)

    add(store, "few", {1: [jep("few", 1, i, score=i / 18, chars=10 + i) for i in range(19)]})
    f = diagnose(store, "few").finding("judge_length_bias")
    assert f.status == "skipped" and f.skipped == "needs 20+ judge scores (19 here)"


def test_position_bias(store):
    """Group calls where position 0 averages 0.9 and the others 0.5: spread 0.4 fires; equal
    means do not; single-episode judgements: skipped with a note."""
    def group_run(run, first):
        return {1: [jep(run, 1, 4 * g + p, score=first if p == 0 else 0.5, mode="group", position=p)
                    for g in range(5) for p in range(4)]}

    add(store, "pos", group_run("pos", 0.9))
    f = diagnose(store, "pos").finding("judge_position_bias")
    assert f.fired and f.numbers["spread"] == 0.4
    assert f.numbers["positions"]["0"] == {"episodes": 5, "score_mean": 0.9}
    assert f.numbers["positions"]["3"] == {"episodes": 5, "score_mean": 0.5}

    add(store, "even", group_run("even", 0.5))
    assert diagnose(store, "even").finding("judge_position_bias").status == "no"

    add(store, "single", {1: [jep("single", 1, i, score=0.5) for i in range(4)]})
    f = diagnose(store, "single").finding("judge_position_bias")
    assert f.status == "skipped" and "no group judgements" in f.skipped


def test_constant_judge(store):
    """20 scores of 0.7 for different answers: std 0, fires (and no length correlation is
    claimed); scores that vary do not; under 20 scores: skipped."""
    add(store, "const", {1: [jep("const", 1, i, score=0.7, chars=5 + i) for i in range(20)]})
    d = diagnose(store, "const")
    f = d.finding("judge_constant")
    assert f.fired and f.numbers == {"episodes": 20, "score_mean": 0.7, "score_std": 0.0, "distinct_scores": 1}
    assert len(f.examples) == 5
    assert d.finding("judge_length_bias").status == "no"  # a constant score has no rank correlation

    add(store, "vary", {1: [jep("vary", 1, i, score=(i % 2) * 1.0) for i in range(20)]})
    f = diagnose(store, "vary").finding("judge_constant")
    assert not f.fired and f.numbers["score_std"] == 0.5 and f.numbers["distinct_scores"] == 2

    add(store, "short", {1: [jep("short", 1, i, score=0.7) for i in range(19)]})
    assert diagnose(store, "short").finding("judge_constant").status == "skipped"


def test_drift_and_error_rate_by_iteration(store):
    """Six iterations of rule-positive episodes scored 1.0 (iterations 1-2), 0.8 (3-4) and 0.6
    (5-6): 1.0 -> 0.6 moves 0.4, fires. One errored judgement (2 unparseable answers in 2 calls)
    in iteration 6 of 5 judged episodes: error rate 0.2 there, parse-error rate 2/6. A stable
    judge (0.95 throughout) does not fire; two iterations are skipped."""
    level = {1: 1.0, 2: 1.0, 3: 0.8, 4: 0.8, 5: 0.6, 6: 0.6}
    by_it = {it: [jep("drift", it, i, score=s, rule=1.0) for i in range(4)] for it, s in level.items()}
    by_it[6].append(jep("drift", 6, 4, score=None, rule=1.0, calls=2, parse_errors=2, error="unparseable answer"))
    add(store, "drift", by_it)
    f = diagnose(store, "drift").finding("judge_drift")
    assert f.fired
    assert f.numbers["first_third"] == 1.0 and f.numbers["last_third"] == 0.6 and f.numbers["move"] == -0.4
    assert f.numbers["first_iterations"] == [1, 2] and f.numbers["last_iterations"] == [5, 6]
    assert f.numbers["rule_positive_score_by_iteration"] == {str(it): s for it, s in level.items()}
    assert f.numbers["error_rate_by_iteration"]["6"] == 0.2 and f.numbers["error_rate_by_iteration"]["1"] == 0.0
    assert f.numbers["parse_error_rate_by_iteration"]["6"] == round(2 / 6, 4)
    assert "errors 1/25" in f.summary

    add(store, "stable", {it: [jep("stable", it, i, score=0.95, rule=1.0) for i in range(4)] for it in range(1, 7)})
    f = diagnose(store, "stable").finding("judge_drift")
    assert f.status == "no" and f.numbers["move"] == 0.0

    add(store, "two", {it: [jep("two", it, i, score=0.95, rule=1.0) for i in range(4)] for it in (1, 2)})
    assert diagnose(store, "two").finding("judge_drift").status == "skipped"


def test_cache_and_cost(store):
    """Calls, cache hits, rule-decided episodes, errors and the latency quantiles of the calls
    made (cached and rule-decided ones take none), by the judge/latency_p*_s metrics' rule."""
    eps = [jep("cost", 1, i, score=0.9, latency_s=float(i + 1)) for i in range(10)]  # 1..10 s, 1 call each
    eps += [jep("cost", 1, 10 + i, score=0.9, cached=True) for i in range(3)]
    eps += [jep("cost", 1, 13 + i, score=None, rule=1.0, judged=False) for i in range(2)]
    eps += [jep("cost", 1, 15, score=None, calls=2, parse_errors=2, latency_s=20.0, error="unparseable answer")]
    add(store, "cost", {1: eps})
    d = diagnose(store, "cost")
    f = d.finding("judge_cost")
    assert f.status == "no" and d.judgements == 16
    assert f.numbers == {"episodes": 16, "judged": 14, "rule_decided": 2, "calls": 12, "cache_hits": 3, "errors": 1,
                         "parse_errors": 2, "latency_p50_s": 6.0, "latency_p99_s": 20.0, "models": ["judge-m"]}


def test_a_run_without_judgements_has_no_judge_section(store, tmp_path):
    add(store, "plain", {1: [Episode(group_id="g", env_id="t/Env-v0", task_id="t", seed=0, episode_id="plain/it1/0",
                                     terminated=True, termination_reason=TerminationReason.ENV_TERMINATED,
                                     turns=[Turn([1], [2], [-1.0], reward=1.0, action_text="4")])]})
    d = diagnose(store, "plain")
    assert d.judge == [] and d.judgements == 0 and d.to_json()["judge"] == {"judgements": 0, "findings": []}


def test_cli_report_and_json_carry_the_judge_section(store, tmp_path):
    from agentrl.cli import app

    add(store, "cli", {1: [jep("cli", 1, i, score=0.7, rule=1.0 if i < 10 else 0.0) for i in range(20)]})
    runner = CliRunner()
    res = runner.invoke(app, ["diagnose", str(tmp_path / "replay.db"), "--json"])
    assert res.exit_code == 1, res.output  # a judge check fires
    out = json.loads(res.stdout)
    by = {f["check"]: f for f in out["judge"]["findings"]}
    assert out["judge"]["judgements"] == 20 and len(by) == 6
    assert by["judge_constant"]["status"] == "fires" and "judge_constant" in out["fired"]
    assert by["judge_rule_agreement"]["numbers"]["agree"] == 10
    assert by["judge_position_bias"]["status"] == "skipped" and "judge_position_bias" in out["skipped"]
    text = runner.invoke(app, ["diagnose", str(tmp_path / "replay.db")], env={"COLUMNS": "200"})
    assert text.exit_code == 1, text.output
    assert "judge (20 judged training episodes)" in text.stdout
    rows = {line.split("│")[1].strip(): line for line in text.stdout.splitlines() if line.count("│") >= 4}
    assert "FIRES" in rows["judge_constant"] and "skipped" in rows["judge_position_bias"]
    assert "no group judgements" in rows["judge_position_bias"]


def test_a_schema_9_database_says_no_judgements(tmp_path: Path):
    """A database at revision 0009 (no ``judgements`` table), opened read-only by ``agentrl
    diagnose``: the judge section says "no judgements", nothing fails, the file is not written."""
    from agentrl.cli import app

    path = tmp_path / "replay.db"
    with ReplayStore(f"sqlite:///{path}") as s:
        add(s, "old", {1: [jep("old", 1, i, score=0.7, rule=1.0) for i in range(20)]})
    downgrade(f"sqlite:///{path}", "0009")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    runner = CliRunner()
    res = runner.invoke(app, ["diagnose", str(path), "--json"])
    assert res.exit_code in (0, 1), res.output
    out = json.loads(res.stdout)
    assert out["run_id"] == "old" and out["judge"] == {"judgements": 0, "findings": []}
    text = runner.invoke(app, ["diagnose", str(path)], env={"COLUMNS": "200"})
    assert text.exit_code in (0, 1), text.output
    assert "judge: no judgements in this run" in text.stdout
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
