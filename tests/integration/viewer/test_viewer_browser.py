"""``agentrl view`` in a real browser (Debian's Chromium driven by Playwright), over replay
databases written by real training runs, on SQLite and on PostgreSQL.

Every expected value is read back from the same database through ``ReplayStore``; nothing
about the runs is hard-coded beyond the training set-up in real_runs.py.
"""

from __future__ import annotations

import re
import shlex
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.integration.viewer.real_runs import ENV_ID, XSS_FLAG, XSS_PAYLOAD

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stored(viewer):
    """What the store holds for the runs the viewer serves: ``{run_id: [Episode, ...]}``."""
    from agentrl.replay import ReplayStore

    server, runs = viewer
    store = ReplayStore(server.db_url)
    try:
        out = {}
        for run_id in (*runs.run_ids, runs.xss_run_id):
            out[run_id] = [store.get_episode(s.episode_id) for s in store.list_episodes(run_id, limit=1000)]
        return out
    finally:
        store.close()


def _query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def test_runs_page_opens_the_run(page, viewer, stored):
    server, runs = viewer
    response = page.goto(server.base + "/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    rows = page.get_by_test_id("run-row")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.runId)")) == sorted(stored)
    row = page.locator(f'[data-testid="run-row"][data-run-id="{runs.run_ids[0]}"]')
    assert ENV_ID in row.inner_text() and "finished" in row.inner_text()
    row.get_by_test_id("run-link").click()
    page.wait_for_url(re.compile(r"/run\?"))
    assert page.get_by_test_id("run-title").inner_text() == runs.run_ids[0]
    assert page.get_by_test_id("run-status").inner_text() == "finished"
    # token accounting: the generated tokens of iteration 1 (the run's only one; iterations are
    # numbered from 1) are the stored episodes' sum
    generated = sum(len(t.completion_ids) for ep in stored[runs.run_ids[0]] for t in ep.turns)
    cells = page.get_by_test_id("token-accounting").locator("tbody tr").first.locator("td").all_inner_texts()
    assert cells[0] == "1" and float(cells[1].replace(",", "")) == generated


def test_a_chart_point_opens_the_episodes_behind_it(page, viewer, stored):
    server, runs = viewer
    run_id = runs.run_ids[0]
    page.goto(f"{server.base}/run?id={run_id}")
    point = page.get_by_test_id("chart-reward-iteration").get_by_test_id("chart-point").last  # drawn on top
    point.click()
    page.wait_for_url(re.compile(r"/episodes\?"))
    assert _query(page.url) == {"run": [run_id], "iteration": ["1"]}  # the run's only iteration, numbered from 1
    shown = page.get_by_test_id("episode-row").evaluate_all("rs => rs.map(r => r.dataset.episodeId)")
    assert sorted(shown) == sorted(ep.episode_id for ep in stored[run_id])


def _apply(page) -> None:
    """Submit the episode filters and wait for the page they load."""
    with page.expect_navigation():
        page.get_by_test_id("apply-filters").click()


def _shown_ids(page) -> list[str]:
    return sorted(page.get_by_test_id("episode-row").evaluate_all("rs => rs.map(r => r.dataset.episodeId)"))


def test_filters_narrow_the_episodes(page, viewer, stored):
    server, runs = viewer
    run_id = runs.run_ids[0]
    eps = stored[run_id]
    page.goto(f"{server.base}/episodes?run={run_id}")
    assert _shown_ids(page) == sorted(e.episode_id for e in eps)

    task = eps[0].task_id
    page.get_by_test_id("filter-task").fill(task)
    _apply(page)
    assert _shown_ids(page) == sorted(e.episode_id for e in eps if e.task_id == task)
    assert set(page.locator('[data-testid="episode-row"] td.task').all_inner_texts()) == {task}

    page.get_by_test_id("filter-task").fill("")
    page.get_by_test_id("filter-termination").select_option(eps[0].termination_reason.value)
    page.get_by_test_id("filter-reward-min").fill(str(max(e.total_reward for e in eps) + 1))
    _apply(page)
    assert _shown_ids(page) == [] and page.get_by_test_id("no-episodes").is_visible()

    word = "blank"  # in the remove_blank_lines task's observations only
    page.get_by_test_id("filter-reward-min").fill("")
    page.get_by_test_id("filter-text").fill(word)
    _apply(page)
    expected = sorted(e.episode_id for e in eps if e.termination_reason == eps[0].termination_reason and any(
        word in (t.action_text + t.observation_text).lower() for t in e.turns))
    assert expected and _shown_ids(page) == expected


def test_an_episode_shows_its_sandbox_commands_and_coloured_tokens(page, viewer, stored):
    server, runs = viewer
    run_id = runs.run_ids[0]
    page.goto(f"{server.base}/episodes?run={run_id}")
    row = page.get_by_test_id("episode-row").first
    episode_id = row.get_attribute("data-episode-id")
    row.get_by_test_id("episode-link").click()
    page.wait_for_url(re.compile(r"/episode\?"))
    ep = next(e for e in stored[run_id] if e.episode_id == episode_id)
    assert page.get_by_test_id("episode-title").get_attribute("data-episode-id") == episode_id

    turns = page.get_by_test_id("turn")
    assert turns.count() == len(ep.turns)
    for k, turn in enumerate(ep.turns):
        shown = turns.nth(k)
        assert shown.get_by_test_id("turn-action").inner_text() == turn.action_text
        commands = shown.get_by_test_id("sandbox-command")
        assert commands.count() == len(turn.exec_results) > 0
        for j, res in enumerate(turn.exec_results):
            cmd = commands.nth(j)
            text = res.command if isinstance(res.command, str) else shlex.join(res.command)
            assert cmd.locator("pre.cmd").inner_text().rstrip("\n") == text
            assert cmd.get_by_test_id("exit-code").inner_text() == str(res.exit_code)
            if res.stdout:
                assert cmd.get_by_test_id("stdout").inner_text().rstrip("\n") == res.stdout.rstrip("\n")

    from agentrl.replay.read import TOKEN_PAGE_SIZE

    # loss_mask as stored: 0 on each turn's prompt ids, 1 on its sampled ids, in order
    expected = [m for t in ep.turns for m in ["0"] * len(t.prompt_ids) + ["1"] * len(t.completion_ids)]
    masks = page.get_by_test_id("token").evaluate_all("ts => ts.map(t => t.dataset.lossMask)")
    assert masks == expected[:TOKEN_PAGE_SIZE]
    assert "1" in masks and "0" in masks
    colour = "ts => getComputedStyle(ts[0]).backgroundColor"
    sampled, prompt = page.locator('[data-testid="token"][data-loss-mask="1"]'), page.locator('[data-testid="token"][data-loss-mask="0"]')
    assert sampled.evaluate_all(colour) != prompt.evaluate_all(colour)
    # hover: the token's behavior log-prob (the engine's, as stored) is read out
    first = sampled.first
    first.hover()
    shown_lp = first.get_attribute("data-lp")
    lp = ep.turns[0].behavior_log_probs[0]
    assert abs(float(shown_lp) - lp) <= 5e-3 * max(1.0, abs(lp)), (shown_lp, lp)  # shown to 4 digits
    assert f"behavior log-prob {shown_lp}" in page.get_by_test_id("token-info").inner_text()


def test_the_group_page_shows_every_rollout_of_the_task(page, viewer, stored):
    server, runs = viewer
    run_id = runs.run_ids[0]
    ep = stored[run_id][0]
    page.goto(f"{server.base}/episodes?run={run_id}")
    page.locator(f'[data-testid="episode-row"][data-episode-id="{ep.episode_id}"]').get_by_test_id("episode-link").click()
    page.wait_for_url(re.compile(r"/episode\?"))
    page.get_by_test_id("episode-facts").get_by_test_id("group-link").click()
    page.wait_for_url(re.compile(r"/group\?"))
    group = sorted(e.episode_id for e in stored[run_id] if e.group_id == ep.group_id)
    shown = page.get_by_test_id("group-rollout").evaluate_all("rs => rs.map(r => r.dataset.episodeId)")
    assert sorted(shown) == group and len(group) == 2
    assert page.get_by_test_id("group-reward").count() == len(group)
    steps = sum(len(e.turns) for e in stored[run_id] if e.group_id == ep.group_id)
    assert page.get_by_test_id("group-step").count() == steps


def test_diff_of_two_runs_aligns_the_same_task(page, viewer, stored):
    server, runs = viewer
    a, b = runs.run_ids
    page.goto(f"{server.base}/diff?a={a}&b={b}")
    tasks = sorted({e.task_id for e in stored[a]} & {e.task_id for e in stored[b]})
    assert len(tasks) == 2  # same seed: the same task ids
    shown = page.get_by_test_id("diff-task").locator("option").evaluate_all("os => os.map(o => o.value)")
    assert sorted(shown) == tasks
    task = page.get_by_test_id("diff-task").input_value()
    side = {}
    for name, run_id in (("a", a), ("b", b)):
        side[name] = _query(page.get_by_test_id(f"diff-episode-{name}").get_attribute("href"))["id"][0]
        assert side[name] in {e.episode_id for e in stored[run_id] if e.task_id == task}
    ea, eb = (next(e for e in stored[r] if e.episode_id == side[n]) for n, r in (("a", a), ("b", b)))
    rows = page.get_by_test_id("diff-row")
    assert rows.count() == max(len(ea.turns), len(eb.turns))
    same = [ta.action_text == tb.action_text and ta.observation_text == tb.observation_text
            for ta, tb in zip(ea.turns, eb.turns)]
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.same)")[:len(same)] == [str(x).lower() for x in same]


XSS_PAGES = ("/episode?id={ep}", "/episodes?run={run}", "/group?run={run}&id={group}", "/run?id={run}", "/",
             "/diff?a={run}&b={other}")


def test_model_output_with_html_is_shown_as_text_and_never_runs(page, viewer, stored):
    """Model output is never run as code: a ``<script>`` element and an ``onerror`` attribute in model
    output (and in the observation, anchor, command and sandbox output) are text: no dialog
    opens and ``window.__pwned`` stays undefined on every page that shows them."""
    server, runs = viewer
    (ep,) = stored[runs.xss_run_id]
    from urllib.parse import quote

    for path in XSS_PAGES:
        url = server.base + path.format(ep=quote(ep.episode_id, safe=""), run=quote(runs.xss_run_id, safe=""),
                                        group=quote(ep.group_id, safe=""), other=quote(runs.run_ids[0], safe=""))
        response = page.goto(url)
        assert response.status == 200, (url, response.status)
        page.wait_for_load_state("networkidle")
        assert page.evaluate(f"() => typeof window.{XSS_FLAG}") == "undefined", url
        assert page.dialogs == [], (url, page.dialogs)
        assert page.evaluate("() => document.querySelectorAll('[onerror], [onload], img[src=x], svg[onload]').length") == 0
        assert not page.evaluate(f"() => [...document.scripts].some(s => s.textContent.includes('{XSS_FLAG}'))")
    # the episode page shows the payload as the characters it is
    page.goto(server.base + "/episode?id=" + quote(ep.episode_id, safe=""))
    assert page.get_by_test_id("turn-action").first.inner_text() == XSS_PAYLOAD
    assert page.get_by_test_id("stdout").first.inner_text().rstrip("\n") == XSS_PAYLOAD
    assert XSS_PAYLOAD in page.get_by_test_id("turn-anchor").first.inner_text()
    assert "<script>" in page.get_by_test_id("token-view").inner_text()
    # the hover script writes each token's values into the page: still as text
    page.get_by_test_id("token-view").evaluate(
        "v => v.querySelectorAll('.tok').forEach(t => t.dispatchEvent(new MouseEvent('mouseover', {bubbles: true})))")
    page.locator('[data-testid="token"][data-loss-mask="1"]').first.hover()
    assert page.evaluate(f"() => typeof window.{XSS_FLAG}") == "undefined"
    assert page.dialogs == [] and page.page_errors == []
