"""The judge in the viewer, on a SQLite store filled through its own API: the episode page's
Judge section (model, rubric, rule or judge, scores, reason, prompt and raw output, all shown
as text), its rule-decided and error variants, no section for an unjudged episode; the run
page's chart of the judge score against the rule reward per iteration (``judge_iterations``,
known values); a database left at schema 9 (no ``judgements``) renders both pages without
them (HTTP, no browser)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from markupsafe import escape

from agentrl.replay import ReplayStore
from agentrl.replay.read import ReadOnlyDB, ReplayDB, episode_view, judge_iterations
from agentrl.replay.viewer import create_app
from agentrl.types import Episode, JudgeRecord, TerminationReason, Turn
from tests.helpers.replay_schema import downgrade

RUN = "r"
XSS = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
DIGEST = "ab12cd34ef56" + "0" * 52
JUDGED = "r/it1/g/0/a0"
RULE = "r/it1/g/2/a0"
FAILED = "r/it1/g/3/a0"
PLAIN = "r/it1/g/4/a0"
PROMPT = [{"role": "system", "content": "You grade answers."},
          {"role": "user", "content": [{"type": "text", "text": "Task: 96%? Answer: " + XSS}]}]
SCORES = {"correct": 1.0, "clear": 0.5}
JUDGE_RULE = {  # episode id -> (judge score, rule reward); None: the rule decided / the judge failed
    JUDGED: (1.0, 0.0), "r/it1/g/1/a0": (0.0, 0.0), RULE: (None, 1.0), FAILED: (None, 0.0),
    "r/it2/g/0/a0": (1.0, 1.0), "r/it2/g/1/a0": (0.25, 1.0), "r/it2/g/2/a0": (0.5, 0.0),
}
"""Iteration 1: two scored (one disagrees), one rule-decided, one failed; iteration 2: three scored,
two disagree (0.25 against a rule pass; 0.5 counts as the judge's pass against a rule fail)."""


def _record(eid: str) -> JudgeRecord:
    score, rule = JUDGE_RULE[eid]
    if eid == RULE:
        return JudgeRecord(model="judge-m", rubric="equiv", rubric_digest=DIGEST, rule_reward=rule, reward=rule,
                           judged=False)
    if eid == FAILED:
        return JudgeRecord(model="judge-m", rubric="equiv", rubric_digest=DIGEST, prompt=PROMPT, rule_reward=rule,
                           latency_s=2.5, calls=1, error="judge down: " + XSS)
    scores = dict(SCORES) if eid == JUDGED else {"correct": score}
    return JudgeRecord(model="judge-m", rubric="equiv" + (XSS if eid == JUDGED else ""), rubric_digest=DIGEST,
                       prompt=PROMPT, output='{"scores": ' + XSS + "}", scores=scores,
                       reasons={"": "equal " + XSS, "correct": "96% is 0.96"}, score=score,
                       gate_failed="correct" if score == 0.0 else None, rule_reward=rule, reward=score,
                       latency_s=0.25, cached=eid != JUDGED, calls=0 if eid != JUDGED else 1)


def _episode(eid: str, judgement: JudgeRecord | None) -> Episode:
    reward = None if judgement is not None and judgement.error else (judgement.reward if judgement else 0.0)
    err = judgement is not None and judgement.error is not None
    return Episode(group_id="g", env_id="x/E-v0", task_id=f"t-{eid}", seed=1,
                   turns=[Turn([1, 2], [3, 4], [-0.5, -0.25], reward=reward, action_text="96%")], terminated=True,
                   termination_reason=TerminationReason.REWARD_ERROR if err else TerminationReason.ENV_TERMINATED,
                   error={"type": "JudgeError", "message": "judge down"} if err else None, episode_id=eid,
                   judgement=judgement)


def fill(url: str) -> str:
    """Run ``r``: the judged episodes of ``JUDGE_RULE`` in iterations 1 and 2, an unjudged one
    (``PLAIN``) and a judged eval episode (left out of the chart); returns ``url``."""
    with ReplayStore(url) as store:
        store.start_run(RUN, {})
        for it in (1, 2):
            store.add_episodes(RUN, it, [_episode(e, _record(e)) for e in JUDGE_RULE if f"/it{it}/" in e]
                               + ([_episode(PLAIN, None)] if it == 1 else []))
        evaluated = JudgeRecord(model="judge-m", rubric="equiv", rubric_digest=DIGEST, score=0.0, rule_reward=1.0,
                                reward=0.0)
        store.add_episodes(RUN, 2, [_episode("r/eval/it2/g/0/a0", evaluated)], kind="eval")
    return url


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory):
    rdb = ReadOnlyDB(fill(f"sqlite:///{tmp_path_factory.mktemp('judge') / 'replay.db'}"))
    yield rdb
    rdb.close()


@pytest.fixture(scope="module")
def client(db: ReplayDB):
    with TestClient(create_app(db, allowed_hosts=["testserver"])) as c:
        yield c


def _section(text: str) -> str:
    assert text.count('data-testid="judge"') == 1
    return text.split('<section id="judge" data-testid="judge">')[1].split("</section>")[0]


def _dd(section: str, testid: str) -> str:
    return re.search(rf'data-testid="{testid}">(.*?)</dd>', section, re.S).group(1)


def test_the_judge_section_shows_the_judgement_as_text(client: TestClient) -> None:
    page = client.get("/episode", params={"id": JUDGED})
    assert page.status_code == 200, page.text[-500:]
    assert XSS not in page.text and "<img src=x" not in page.text  # never markup, anywhere
    sec = _section(page.text)
    assert _dd(sec, "judge-model") == "judge-m"
    assert str(escape("equiv" + XSS)) in _dd(sec, "judge-rubric") and ">ab12cd34ef56</code>" in sec
    assert DIGEST not in sec.replace(f'title="sha256 {DIGEST}"', "")  # only the first 12 characters shown
    assert _dd(sec, "judge-decided") == "the judge (1 call)"
    assert _dd(sec, "judge-cached") == "no" and _dd(sec, "judge-latency") == "0.250 s"
    assert [re.sub("<[^>]+>", "", _dd(sec, k)) for k in ("judge-rule-reward", "judge-score", "judge-reward")] == \
        ["0", "1", "1"]
    assert 'data-testid="judge-gate-failed"' not in sec and 'data-testid="judge-error"' not in sec
    rows = re.findall(r'data-testid="judge-criterion" data-name="(\w+)"><td>\w+</td>'
                      r'<td data-testid="judge-criterion-score">([^<]*)</td><td>([^<]*)</td>', sec)
    assert rows == [("correct", "1", "96% is 0.96"), ("clear", "0.5", "")]  # the rubric's order
    assert f"equal {escape(XSS)}</p>" in sec
    assert re.findall(r'data-testid="judge-message" data-role="(\w+)"', sec) == ["system", "user"]
    assert f"Task: 96%? Answer: {escape(XSS)}</pre>" in sec  # content parts as their text
    assert f'data-testid="judge-output-text">{{&#34;scores&#34;: {escape(XSS)}}}</pre>' in sec
    assert sec.index('data-testid="judge-prompt"') < sec.index('data-testid="judge-output"')
    assert "<details" in sec


def test_the_rule_decided_and_failed_variants(client: TestClient) -> None:
    rule = _section(client.get("/episode", params={"id": RULE}).text)
    assert _dd(rule, "judge-decided") == "rule decided, no judge call"
    assert re.sub("<[^>]+>", "", _dd(rule, "judge-score")) == "–" and "judge-reward\">1<" in rule
    for absent in ("judge-criterion", "judge-prompt", "judge-output", "judge-error", "no answer from the judge"):
        assert absent not in rule
    failed = client.get("/episode", params={"id": FAILED}).text
    sec = _section(failed)
    assert f'<dd class="bad" data-testid="judge-error">judge down: {escape(XSS)}</dd>' in sec
    assert XSS not in failed and "no answer from the judge" in sec and 'data-testid="judge-criterion"' not in sec
    assert re.sub("<[^>]+>", "", _dd(sec, "judge-reward")) == "–"
    gated = _section(client.get("/episode", params={"id": "r/it1/g/1/a0"}).text)
    assert '<dd class="bad" data-testid="judge-gate-failed">correct</dd>' in gated and "judge-cached\">yes<" in gated
    plain = client.get("/episode", params={"id": PLAIN})
    assert plain.status_code == 200 and 'data-testid="judge' not in plain.text


def test_judge_iterations_compare_the_judge_with_the_rule(db: ReplayDB) -> None:
    it1, it2 = judge_iterations(db, RUN)  # the eval episode is left out
    assert (it1.iteration, it1.episodes, it1.judged, it1.scored, it1.errors, it1.compared, it1.disagree) == \
        (1, 4, 3, 2, 1, 2, 1)
    assert (it1.score_mean, it1.rule_reward_mean, it1.disagree_share) == (0.5, 0.0, 0.5)
    assert (it2.iteration, it2.episodes, it2.judged, it2.scored, it2.errors, it2.compared, it2.disagree) == \
        (2, 3, 3, 3, 0, 3, 2)
    assert it2.score_mean == pytest.approx(1.75 / 3) and it2.rule_reward_mean == pytest.approx(2 / 3)
    assert it2.disagree_share == pytest.approx(2 / 3)
    assert judge_iterations(db, RUN, judge_pass=0.6)[1].disagree == 1  # 0.5 is no pass any more
    assert judge_iterations(db, "no-such-run") == []


def test_the_run_page_charts_the_judge_against_the_rule(client: TestClient) -> None:
    page = client.get("/run", params={"id": RUN})
    assert page.status_code == 200, page.text[-500:]
    chart = page.text.split('data-testid="chart-judge-rule"')[1].split("</figure>")[0]
    assert "Judge score vs rule reward / iteration" in chart
    titles = re.findall(r"<title>([^<]*)</title>", chart)
    assert titles == [
        "judge score (mean): 0.5 at iteration 1 (of 2 scored episodes)",
        "judge score (mean): 0.583 at iteration 2 (of 3 scored episodes)",
        "rule reward (mean): 0 at iteration 1 (of 2 scored episodes)",
        "rule reward (mean): 0.667 at iteration 2 (of 3 scored episodes)",
        "judge ≠ rule (share): 0.5 at iteration 1 (1 of 2 episodes)",
        "judge ≠ rule (share): 0.667 at iteration 2 (2 of 3 episodes)",
    ]
    hrefs = re.findall(r'<a href="([^"]*)" class="pt-link"', chart)
    assert [h.rsplit("iteration=", 1)[1] for h in hrefs] == ["1", "2"] * 3


def test_a_schema_9_database_shows_no_judge(tmp_path: Path) -> None:
    url = fill(f"sqlite:///{tmp_path / 'replay.db'}")
    downgrade(url, "0009")
    db = ReadOnlyDB(url)
    try:
        assert db.table("judgements") is None
        assert judge_iterations(db, RUN) == [] and episode_view(db, JUDGED).judgement is None
        with TestClient(create_app(db, allowed_hosts=["testserver"])) as client:
            episode, run = client.get("/episode", params={"id": JUDGED}), client.get("/run", params={"id": RUN})
        assert episode.status_code == 200 and run.status_code == 200, (episode.text[-500:], run.text[-500:])
        assert 'data-testid="judge' not in episode.text and 'data-testid="turns"' in episode.text
        assert "chart-judge-rule" not in run.text and 'data-testid="chart-reward-iteration"' in run.text
    finally:
        db.close()
