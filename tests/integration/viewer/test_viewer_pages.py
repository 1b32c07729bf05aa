"""The viewer's pages over a real replay database (filled through ``ReplayStore``), at the HTTP
level with FastAPI's TestClient: escaping of model/sandbox output, the CSP header, filters,
sort and keyset pagination, the episode / token / group / diff pages, 404s, refused path
traversal, read-only access, a run in progress. The browser tests are in test_viewer_browser.py beside this file."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from urllib.parse import parse_qs, quote, urlparse

import pytest
from markupsafe import escape

from agentrl.replay import ReplayStore
from agentrl.replay.read import EpisodeFilter, ReadOnlyDB, Sort, episode_page, query_plans
from agentrl.replay.viewer.app import CSP

from tests.integration.viewer.viewer_data import ATTR_XSS, LONG_TOKENS, VIEW, XSS, episode

RAW_ATTACKS = ("<script>window", "<img", 'onerror="', '" onmouseover="', "onmouseover=\"window")


class _Tags(HTMLParser):
    """Every start tag of a page with its attributes, as a browser's parser reads them."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _ids(page_html: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'data-testid="episode-row" data-episode-id="([^"]*)"', page_html)]


def _get(client, url: str, status: int = 200) -> str:
    r = client.get(url)
    assert r.status_code == status, (url, r.status_code, r.text[-600:])
    return r.text


def test_every_page_sends_the_csp_and_only_the_packaged_script(client) -> None:
    ep = quote(VIEW.xss_episode)
    for url in ("/", "/run?id=run-a", "/episodes?run=run-a", f"/episode?id={ep}", "/group?run=run-a&id=a0-g0",
                "/diff?a=run-a&b=run-b", "/episode?id=missing", "/static/viewer.css"):
        r = client.get(url)
        csp = r.headers["content-security-policy"]
        assert csp == CSP and "script-src 'self'" in csp and "unsafe-inline" not in csp, url
        assert r.headers["x-content-type-options"] == "nosniff"
        if r.headers["content-type"].startswith("text/html"):
            tags = _Tags(r.text).tags
            assert [a for t, a in tags if t == "script"] == [{"src": "/static/viewer.js", "defer": None}], url
            assert [t for t, _ in tags if t in ("img", "iframe", "object", "embed", "base")] == [], url
            handlers = [(t, k) for t, a in tags for k in a if k.startswith("on")]
            assert handlers == [], (url, handlers)
            assert all(not (a.get("href") or "").lower().startswith("javascript:") for _, a in tags), url


def test_model_and_sandbox_output_is_shown_as_text(client) -> None:
    page = _get(client, f"/episode?id={quote(VIEW.xss_episode)}")
    for raw in RAW_ATTACKS:
        assert raw not in page, raw
    escaped = str(escape(XSS))
    # action, observation, anchor, command, stdout and stderr: each shown escaped
    assert page.count(escaped) >= 6, page.count(escaped)
    # the task id (with an attribute breakout) appears escaped in text and in attributes
    assert str(escape(ATTR_XSS)) in page
    listing = _get(client, f"/episodes?run=run-a&task={quote(VIEW.xss_task)}")
    assert _ids(listing) == [VIEW.xss_episode]
    assert f'value="{escape(VIEW.xss_task)}"' in listing  # the filter form keeps it as a value
    for raw in RAW_ATTACKS:
        assert raw not in listing, raw
    group = _get(client, "/group?run=run-a&id=g-xss")
    assert "<script>window" not in group and "<img" not in group


def test_runs_and_run_page(client) -> None:
    runs = _get(client, "/")
    assert re.findall(r'data-testid="run-row" data-run-id="([^"]+)"', runs) == ["run-b", "run-a"]
    page = _get(client, "/run?id=run-a")
    for chart in ("reward-iteration", "reward-tokens", "reward-wallclock", "tokens", "phases", "logprob-gap"):
        assert f'data-testid="chart-{chart}"' in page, chart
    assert 'data-testid="chart-staleness"' not in page  # a sync run
    hrefs = set(re.findall(r'<a href="([^"]+)" class="pt-link" data-testid="chart-point"', page))
    targets = {tuple(sorted((k, tuple(v)) for k, v in parse_qs(urlparse(html.unescape(h)).query).items()))
               for h in hrefs}
    assert targets == {(("iteration", (str(it),)), ("run", ("run-a",))) for it in (0, 1)}
    bars = re.findall(r'data-testid="chart-bar"><rect[^>]*><title>([^<]+)</title>', page)
    assert {b.split(":")[1].split()[0] for b in bars} == {"rollout", "credit", "update", "sync"}
    # a point opens the episodes of its iteration
    one = _get(client, "/episodes?run=run-a&iteration=1&limit=200")
    assert len(_ids(one)) == 11 and all(i.startswith(("a1-", "ep-")) for i in _ids(one))
    assert "in progress or not yet checkpointed: 1" in page


@pytest.mark.parametrize("query, expected", [
    ("iteration=0", lambda e: e.startswith("a0-")),
    ("task=task-1&iteration=1", lambda e: e.startswith("a1-1-")),
    ("group=a0-g1", lambda e: e.startswith("a0-1-")),
    ("success=true&iteration=0", lambda e: e in {"a0-0-2", "a0-1-1"}),
    ("reward_min=0.9&iteration=0", lambda e: e in {"a0-0-2", "a0-1-1"}),
    ("reward_max=0.1&iteration=0", lambda e: e in {"a0-0-0", "a0-0-3", "a0-1-2"}),
    ("termination=infra_error", lambda e: e == VIEW.error_episode),
    ("policy_version=1", lambda e: e.startswith("a1-") or e == VIEW.long_episode),
    ("length_min=1000", lambda e: e == VIEW.long_episode),
    ("env=agentrl/Test-v0&length_max=9", lambda e: e != VIEW.long_episode),
    ("env=other&iteration=0", lambda e: False),
    ("q=ls+a1", lambda e: e.startswith(("a0-", "a1-"))),
    ("q=LS+A1", lambda e: e.startswith(("a0-", "a1-"))),
    ("q=obs+2", lambda e: e == VIEW.long_episode),
    ("q=window.__pwned", lambda e: e == VIEW.xss_episode),
])
@pytest.mark.parametrize("probe_rows", [0, 2000])
def test_filters(client, viewer_db, query: str, expected, probe_rows: int, monkeypatch) -> None:
    # probe_rows 0: every filter (and every word found) counts as common, so SQLite walks the
    # sort's index and tests each row (EXISTS for text); 2000: read through the filter's index
    monkeypatch.setattr(query_plans, "PROBE_ROWS", probe_rows)
    got = _ids(_get(client, f"/episodes?run=run-a&limit=200&{query}"))
    everything = [r.episode_id for r in episode_page(viewer_db, "run-a", limit=200).rows]
    assert got == [e for e in everything if expected(e)], (query, got)


@pytest.mark.parametrize("sort", ["default", "reward", "length", "turns"])
@pytest.mark.parametrize("desc", [False, True])
@pytest.mark.parametrize("flt, count", [(EpisodeFilter(), 19), (EpisodeFilter(iteration=1), 11)])
def test_keyset_pages_cover_every_episode_once_in_order(viewer_db: ReadOnlyDB, client, sort: str, desc: bool,
                                                        flt: EpisodeFilter, count: int) -> None:
    # unfiltered: SQLite walks the sort's index; iteration=1 (a selective filter): it reads the
    # filter's index and sorts (agentrl.replay.read.query_plans); the pages must be the same kind
    seen, cursor, pages = [], None, 0
    while True:
        page = episode_page(viewer_db, "run-a", flt, Sort(sort, desc), cursor, limit=4)
        seen += page.rows
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    ids = [r.episode_id for r in seen]
    assert len(ids) == len(set(ids)) == count and pages == -(-count // 4)
    col = {"default": "iteration", "reward": "total_reward", "length": "num_generated_tokens", "turns": "num_turns"}[sort]
    values = [r._mapping[col] for r in seen]
    known = [v for v in values if v is not None]
    assert known == sorted(known, reverse=desc)
    assert all(v is None for v in values[len(known):])  # NULL (the errored episode's reward) last
    if flt.iteration is not None:
        assert {r.iteration for r in seen} == {flt.iteration}
        return
    # the same walk through the HTML next-page links
    url, html_ids = f"/episodes?run=run-a&limit=25&sort={sort}" + ("&desc=true" if desc else ""), []
    for _ in range(3):
        text = _get(client, url)
        html_ids += _ids(text)
        nxt = re.search(r'<a href="([^"]+)" id="next-page"', text)
        if not nxt:
            break
        url = html.unescape(nxt.group(1))
    assert html_ids == ids


def test_episode_page_shows_turns_commands_and_coloured_tokens(client) -> None:
    page = _get(client, "/episode?id=a0-0-1")
    assert page.count('data-testid="turn"') == 2
    assert page.count('data-testid="sandbox-command"') == 2
    assert "bash -lc &#39;ls a1&#39;</pre>" in page and 'data-testid="timed-out"' in page
    assert "[… 1234 bytes cut by the sandbox's output cap]" in page
    assert re.search(r'data-testid="exit-code">1<', page)
    assert 'data-testid="turn-advantage">0.5<' in page and 'data-testid="turn-advantage">0.25<' in page
    masks = re.findall(r'class="tok (m[01])" data-testid="token" [^>]*data-loss-mask="([01])"', page)
    assert [m for m, _ in masks] == [f"m{v}" for _, v in masks]
    assert [int(v) for _, v in masks] == [0] * 6 + [1] * 4 + [0] * 7 + [1] * 5  # prompt/completion of 2 turns
    lps = re.findall(r'data-loss-mask="1" data-turn="\d" data-lp="([^"]*)"', page)
    assert len(lps) == 9 and all(float(x) <= 0 for x in lps)
    heat = _get(client, "/episode?id=a0-0-1&heat=behavior_log_prob")
    classes = re.findall(r'class="tok (h\d|hn)" data-testid="token"', heat)
    assert classes.count("hn") == 13 and {"h0", "h9"} <= set(classes)  # prompt tokens have no log-prob
    assert "trainer_log_prob: not recorded" in heat  # fill() stores no trainer values


def test_long_episode_pages_its_tokens(client) -> None:
    first = _get(client, f"/episode?id={VIEW.long_episode}")
    assert first.count('data-testid="token"') == 1024
    assert f"tokens 0–1023 of {LONG_TOKENS}" in first and 'data-testid="tokens-next"' in first
    last = _get(client, f"/episode?id={VIEW.long_episode}&tok=2048")
    assert last.count('data-testid="token"') == LONG_TOKENS - 2048 and 'data-testid="tokens-next"' not in last
    assert re.findall(r'data-i="(\d+)"', last)[0] == "2048"


def test_group_page_side_by_side_with_anchor_groups(client) -> None:
    page = _get(client, "/group?run=run-a&id=a0-g0")
    assert re.findall(r'data-testid="group-rollout" data-episode-id="([^"]+)"', page) == [f"a0-0-{i}" for i in range(4)]
    # every rollout's turn 0 acted from anchor "start": one step group of 4 steps
    assert re.findall(r'data-testid="anchor-group" data-anchor-group="(\d+)"', page) == ["0"]
    assert page.count('data-anchor-group="0"') == 4 + 1
    assert page.count('data-testid="group-step"') == 8


def test_diff_of_two_runs_and_of_two_iterations(client) -> None:
    runs = _get(client, "/diff?a=run-a&b=run-b&task=task-1")
    rows = re.findall(r'data-testid="diff-row" data-same="(true|false)"', runs)
    assert rows == ["false", "false"]  # other actions in every turn
    assert "ls a0" in runs and "ls b0" in runs
    diffs = re.findall(r'data-testid="diff-text">([^<]*)</pre>', runs)
    assert len(diffs) == 2 and "-&lt;bash&gt;ls a0&lt;/bash&gt;\n+&lt;bash&gt;ls b0&lt;/bash&gt;" in diffs[0]
    its = _get(client, "/diff?a=run-a&ia=0&b=run-a&ib=1")
    assert re.findall(r'<option value="(task-[01])"', its) == ["task-0", "task-1"]
    assert re.findall(r'data-testid="diff-row" data-same="(true|false)"', its) == ["true", "true"]
    none = _get(client, "/diff?a=run-a&ia=1&b=run-b&ib=0&task=task-long", status=404)
    assert "was not run on both sides" in none


@pytest.mark.parametrize("url, status, message", [
    ("/run?id=nope", 404, "run &#39;nope&#39; is not in"),
    ("/episodes?run=nope", 404, "run &#39;nope&#39;"),
    ("/episode?id=nope", 404, "episode &#39;nope&#39;"),
    ("/group?run=run-a&id=nope", 404, "group &#39;nope&#39;"),
    ("/diff?a=run-a&b=nope", 404, "run &#39;nope&#39;"),
    ("/episode", 400, "parameter id is required"),
    ("/episodes?run=run-a&iteration=x", 400, "parameter iteration=&#39;x&#39;; expected int"),
    ("/episodes?run=run-a&reward_min=nan", 400, "expected a number"),
    ("/episodes?run=run-a&sort=evil", 400, "parameter sort="),
    ("/episodes?run=run-a&limit=7", 400, "parameter limit=7"),
    ("/episodes?run=run-a&termination=bogus", 400, "parameter termination="),
    ("/episodes?run=run-a&cursor=%%%", 400, "is not a page cursor"),
    ("/episodes?run=run-a&sort=reward&cursor=WyJ4IiwiYSIsMF0", 400, "does not belong to sort"),
    ("/episode?id=a0-0-1&heat=__class__", 400, "parameter heat="),
    ("/episode?id=a0-0-1&tok=-5", 400, "parameter tok=-5"),
    ("/nothing-here", 404, "Not Found"),
])
def test_bad_requests_get_a_page_not_a_traceback(client, url: str, status: int, message: str) -> None:
    text = _get(client, url, status)
    assert message in text and "Traceback" not in text and 'data-testid="error-message"' in text


@pytest.mark.parametrize("path", [
    "/static/../app.py", "/static/..%2fapp.py", "/static/%2e%2e/app.py", "/static/..%2f..%2fqueries.py",
    "/static/%2e%2e%2f%2e%2e%2fmodels.py", "/static//etc/passwd", "/static/../../../../etc/passwd",
    "/static/templates/base.html", "/static/%00viewer.js",
])
def test_no_url_reaches_the_file_system_outside_static(client, path: str) -> None:
    r = client.get(path)
    assert r.status_code in (400, 404), (path, r.status_code)
    assert "import " not in r.text and "root:" not in r.text and "{% block" not in r.text


def test_static_files_are_packaged(client) -> None:
    js = client.get("/static/viewer.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"] and "textContent" in js.text
    assert "innerHTML" not in js.text and "eval(" not in js.text
    assert client.get("/static/viewer.css").status_code == 200


def test_read_only_and_a_run_in_progress(viewer_db_url: str, client, viewer_db: ReadOnlyDB) -> None:
    with pytest.raises(Exception, match="read-only|readonly|read only"):
        with viewer_db.read() as conn:
            conn.exec_driver_sql("DELETE FROM runs")
    assert "a0-0-0" in _ids(_get(client, "/episodes?run=run-a&iteration=0"))
    # a writer adds an iteration while the viewer is open: the next request sees it
    store = ReplayStore(viewer_db_url)
    try:
        store.add_episodes("run-b", 1, [episode("b1-new", "task-0", "b1-g0", reward=1.0)])
        store.add_metrics("run-b", 1, {"rollout/reward_mean": 0.75})
        assert _ids(_get(client, "/episodes?run=run-b&iteration=1")) == ["b1-new"]
        assert "<title>reward: 0.75 at iteration 1</title>" in _get(client, "/run?id=run-b")
    finally:
        store.rewind("run-b", 1)
        store.close()


def test_token_hover_values_trainer_side_and_heat_map(client) -> None:
    page = _get(client, "/episode?id=a0-0-0")
    sampled = re.findall(r'data-loss-mask="1" data-turn="(\d)" data-lp="([^"]*)" data-tlp="([^"]*)" '
                         r'data-gap="([^"]*)" data-ent="([^"]*)" data-adv="([^"]*)" data-v="([^"]*)"', page)
    assert len(sampled) == 4 + 5
    turn0, turn1 = sampled[:4], sampled[4:]
    for j, (_, lp, tlp, gap, ent, adv, v) in enumerate(turn0):
        assert float(tlp) == pytest.approx(float(lp) + 0.01 * j, abs=1e-3)
        assert float(gap) == pytest.approx(0.01 * j, abs=1e-6) and float(ent) == 0.5 + j
        assert float(adv) == 0.5 and v == "0"
    assert all(t[2] == t[3] == t[4] == "" and t[5] == "0.25" for t in turn1)  # turn 1 was not trained
    heat = _get(client, "/episode?id=a0-0-0&heat=entropy")
    classes = re.findall(r'class="tok (h\d|hn)" data-testid="token"', heat)
    assert classes.count("hn") == len(classes) - 4 and {"h0", "h9"} <= set(classes)


def test_reruns_are_shown_on_the_episode_page(client) -> None:
    page = _get(client, "/episode?id=a0-0-1")
    assert page.count('data-testid="rerun-row"') == 1
    row = page[page.index('data-testid="rerun-row"'):]
    assert '<span class="bad">different</span>' in row and "<td>1</td>" in row
    assert "turn 1: different" in row and str(escape("+file1 " + XSS)) in row and "<script>window" not in page
    assert "Not rerun yet" in _get(client, "/episode?id=a0-0-2")


def test_diagnose_page_runs_the_checks_of_agentrl_diagnose(client) -> None:
    page = _get(client, "/diagnose?run=run-a")
    checks = re.findall(r'data-testid="finding" data-check="([^"]+)" data-fired="(true|false)"', page)
    from agentrl.replay.diagnose.checks import CHECKS

    assert len(checks) == len(CHECKS) > 0
    assert 'data-testid="diagnose-link"' in _get(client, "/run?id=run-a")
    assert "<script>window" not in page
    _get(client, "/diagnose?run=nope", 404)
    _get(client, "/diagnose?run=run-a&max=0", 400)
