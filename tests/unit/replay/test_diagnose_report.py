"""``agentrl diagnose``'s reading of answers and its report: ``\\boxed{}`` answers read with
brace matching (LaTeX fractions are not all "2"), checks that cannot run say ``skipped`` and
why (table and JSON), the task classes count training episodes only, and example links are
never wrapped when stdout is not a terminal. Runs are written through the real replay store."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from agentrl.replay import ReplayStore
from agentrl.replay.diagnose import diagnose, episode_link, last_boxed, normalize_answer
from test_diagnose import Run, ep, healthy, words


@pytest.fixture
def store(tmp_path):
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as s:
        yield s


@pytest.mark.parametrize("text, boxed, answer", [
    (r"so \boxed{\frac{1}{2}}", r"\frac{1}{2}", r"\frac{1}{2}"),
    (r"\boxed{\frac{3}{2}}.", r"\frac{3}{2}", r"\frac{3}{2}"),
    (r"x = \boxed{\sqrt{2}}", r"\sqrt{2}", r"\sqrt{2}"),
    (r"\boxed {x + 1}", "x + 1", "x + 1"),  # a space before the brace, as TeX allows
    (r"\fbox{Paris}", "Paris", "paris"),
    (r"first \boxed{1}, then \boxed{ 2 }", " 2 ", "2"),  # the last box wins
    (r"\boxed{\left\{ a^{2} \right\}}", r"\left\{ a^{2} \right\}", r"\left\{ a^{2} \right\}"),  # escaped braces
    (r"\boxed{a \boxed{b}} done", r"a \boxed{b}", r"a \boxed{b}"),  # a box in a box belongs to the outer one
    (r"\boxed{7} and then \boxed{\frac{1}{2", "", ""),  # the last box is never closed: no answer
    (r"\boxedx{3} so 4", None, "4"),  # another command, not a box
    (r"\boxed 5", None, "5"),  # no braced argument
    ("answer: 42.", None, "42"),
])
def test_boxed_answers_are_read_with_brace_matching(text, boxed, answer):
    assert last_boxed(text) == boxed
    assert normalize_answer(text) == answer


@pytest.mark.parametrize("a, b", [
    ("1000001", "1000002"),  # 6 significant digits ('%g') made both '1e+06'
    (r"\boxed{1234567}", r"\boxed{1234568}"),
    ("3.14159265", "3.14159"),
    ("The total is 1,000", "3,000"),  # the thousands separator split the number: both '0'
    ("The total is 1,000", "The total is 2,000"),
    ("$2,500", "$3,500"),
    ("x = 0.1", "x = 0.10000001"),
    ("-5", "5"),
])
def test_different_numbers_are_different_answers(a, b):
    assert normalize_answer(a) != normalize_answer(b)


@pytest.mark.parametrize("texts, answer", [
    (["2", "2.0", "2.00", "+2", r"\boxed{2.0}", "answer: 2.", "so it is 2"], "2"),
    (["The total is 1,000", r"\boxed{1,000}", "1000", "1000.0", "answer: 1,000."], "1000"),
    (["$2,500", "2500"], "2500"),
    (["1,234,567.50", r"\boxed{1234567.5}"], "1234567.5"),
    (["3.14159265", "3.141592650"], "3.14159265"),
    ([".5", "0.50", "half is 0.5"], "0.5"),
    (["-12.5.", "x = -12.50"], "-12.5"),
    (["-0", "0.0", "-0.00"], "0"),
    (["1000001"], "1000001"),
])
def test_equal_numbers_are_one_exact_answer(texts, answer):
    assert [normalize_answer(t) for t in texts] == [answer] * len(texts)


def test_different_fractions_are_different_answers_not_a_wrong_reference(store):
    """Eight samples with eight different wrong fractions: the samples disagree (unsolved);
    a regex that stops at the first ``}`` read every one as "2" and called it a wrong reference.
    Eight samples giving one fraction do agree."""
    r = Run(store, "frac")
    fracs = [r"\frac{1}{2}", r"\frac{3}{2}", r"\sqrt{2}", r"\frac{5}{2}", r"\frac{7}{2}", r"2^{2}", r"\frac{9}{2}",
             r"\frac{11}{2}"]
    eps = [ep("frac", 0, "spread", g, i, reward=0.0, success=False, text=f"so \\boxed{{{fracs[4 * g + i]}}}")
           for g in range(2) for i in range(4)]
    eps += [ep("frac", 0, "agreed", g, i, reward=0.0, success=False, text=f"thus \\boxed{{\\frac{{{1}}}{{2}}}}")
            for g in range(2) for i in range(4)]
    r.add(0, eps)
    d = diagnose(store, "frac")
    verdicts = {t.task_id: t for t in d.tasks}
    assert verdicts["spread"].verdict == "unsolved" and verdicts["spread"].agree_frac == 1 / 8
    assert verdicts["agreed"].verdict == "wrong_reference" and verdicts["agreed"].agreed_answer == r"\frac{1}{2}"
    assert d.finding("wrong_reference").tasks == ["agreed"]


def test_checks_that_cannot_run_say_skipped_with_the_reason(store, tmp_path):
    """One iteration: the checks that compare iterations (or need update metrics, eval points,
    stale samples) could not run. They say ``skipped`` and why, in the JSON and in the table,
    never ``no``; the checks that did run say ``no``."""
    from agentrl.cli import app

    rng = random.Random(11)
    Run(store, "one").add(0, healthy("one", 0, rng), {"rollout/reward_mean": 0.5})
    d = diagnose(store, "one")
    skipped = {f.check: f.skipped for f in d.findings if f.skipped is not None}
    assert set(skipped) == {"train_up_eval_flat", "answers_converging", "length_growth", "update_spikes", "stale_async"}
    assert skipped["length_growth"] == "needs 2+ iterations"
    assert d.finding("reward_flat").status == "no" and d.finding("length_growth").status == "skipped"
    assert not d.fired()

    runner = CliRunner()
    res = runner.invoke(app, ["diagnose", str(tmp_path / "replay.db"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    by = {f["check"]: f for f in out["findings"]}
    assert by["length_growth"]["status"] == "skipped" and by["length_growth"]["skipped"] == "needs 2+ iterations"
    assert by["reward_flat"]["status"] == "no" and by["reward_flat"]["skipped"] is None
    assert sorted(out["skipped"]) == sorted(skipped)

    text = runner.invoke(app, ["diagnose", str(tmp_path / "replay.db")], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    rows = {line.split("│")[2].strip(): line for line in text.stdout.splitlines() if line.count("│") >= 5}
    assert "│ skipped │ needs 2+ iterations" in rows["length_growth"]
    assert "│ skipped │ needs 4+ iterations" in rows["update_spikes"]
    assert "│ no      │ 0 of 6 groups" in rows["reward_flat"]
    assert "5 skipped: train_up_eval_flat" in text.stdout


def test_the_viewer_says_skipped_too(store, tmp_path):
    """The viewer's /diagnose page shows the same three states as the terminal report."""
    import re

    from fastapi.testclient import TestClient

    from agentrl.replay.read import ReadOnlyDB
    from agentrl.replay.viewer import create_app

    Run(store, "one").add(0, healthy("one", 0, random.Random(11)), {"rollout/reward_mean": 0.5})
    db = ReadOnlyDB(f"sqlite:///{tmp_path / 'replay.db'}")
    try:
        with TestClient(create_app(db, allowed_hosts=["testserver"])) as c:
            page = c.get("/diagnose?run=one").text
    finally:
        db.close()
    status = dict(re.findall(r'data-check="([^"]+)" data-fired="(?:true|false)" data-status="([a-z]+)"', page))
    assert status["length_growth"] == "skipped" and status["reward_flat"] == "no"
    assert 'title="needs 2+ iterations">skipped</span>' in page


def test_task_classes_count_training_episodes_only(store):
    """A training run with eval episodes of the same task (kind eval, sampled at a low
    temperature, all giving one rejected answer): the task's class counts the 8 training
    samples (mixed outcomes: ok), not 8 + 12, and the eval samples' agreement does not make a
    wrong reference; the diagnosis says how many episodes it left out."""
    rng = random.Random(12)
    r = Run(store, "mix")
    r.add(0, healthy("mix", 0, rng, tasks=("a",)))
    evals = [ep("mix", 0, "b", g, i, reward=0.0, success=False, text="answer: 3") for g in range(3) for i in range(4)]
    evals += [ep("mix", 0, "a", 9, i, reward=0.0, success=False, text="answer: 3") for i in range(4)]
    store.add_episodes("mix", 0, evals, {e.episode_id: [0.0] for e in evals}, kind="eval")
    d = diagnose(store, "mix")
    assert [(t.task_id, t.samples, t.verdict) for t in d.tasks] == [("a", 8, "ok")]
    assert d.episodes == 24 and d.other_episodes == 16
    assert "wrong_reference" not in d.fired() and d.finding("constant_judge").numbers["constant_tasks"] == {}
    assert d.to_json()["other_episodes"] == 16


def test_example_links_are_never_wrapped_when_stdout_is_not_a_terminal(tmp_path):
    """Long episode ids under a narrow terminal width (COLUMNS=40, stdout a pipe): every
    example link of the report is printed whole on one line, so it can be copied or clicked."""
    from agentrl.cli import app

    run_id = "a-run-with-a-rather-long-name-" + "x" * 40
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as s:
        r = Run(s, run_id)
        rng = random.Random(13)
        r.add(0, [ep(run_id, 0, t, g, i, reward=0.5, text=words(rng)) for t in ("task-a", "task-b") for g in range(2)
                  for i in range(4)])
        r.add(1, [ep(run_id, 1, "wrong", g, i, reward=0.0, success=False, text="answer: 42") for g in range(2)
                  for i in range(4)])
        d = diagnose(s, run_id)
    links = [episode_link(e, "http://127.0.0.1:8765") for f in d.findings for e in f.examples[:3]]
    links += [episode_link(t.episode_ids[0], "http://127.0.0.1:8765") for t in d.tasks if t.verdict == "wrong_reference"]
    assert links and all(len(link) > 100 for link in links)
    res = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--base-url", "http://127.0.0.1:8765"],
                             env={"COLUMNS": "40"})
    assert res.exit_code == 1, res.output
    lines = res.stdout.splitlines()
    for link in links:
        assert any(line.split()[-1:] == [link] for line in lines), (link, res.stdout)
