"""Tool calls, branches and counters in the viewer, over a database filled through the store
(``fill`` of tests/unit/replay/test_viewer_tool_calls_branches.py: an episode that forked into
three branches with counters, episodes with and without tool calls, an eval episode): the sort
by tool calls pages through every episode once on SQLite and on PostgreSQL; in Chromium
(``agentrl view`` over the SQLite file) the list sorted by tool calls, the share of episodes
without one, and the forked episode's branch labels, branch summary and counters."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from agentrl.replay.read import EpisodeFilter, ReadOnlyDB, Sort, episode_page
from agentrl.replay.viewer import create_app
from tests.integration.viewer.conftest import ViewerServer, serve_filled
from tests.unit.replay.test_viewer_tool_calls_branches import CALLS, COUNTERS, RUN, fill

FORKED = "r/it1/g/0/a0"
TOTALS = {e: sum(c) for e, c in CALLS.items()} | {"r/eval/it2/g/0/a0": 0}
BY_CALLS = sorted(TOTALS, key=lambda e: (TOTALS[e], e))
"""Run ``r``'s episodes by tool calls, then episode id (the sort's tie-breaker)."""


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return fill(f"sqlite:///{tmp_path_factory.mktemp('tool-calls') / 'replay.db'}")
    return fill(request.getfixturevalue("postgres_module_url"))


def test_the_sort_by_tool_calls_pages_every_episode_once_in_order(db_url: str) -> None:
    db = ReadOnlyDB(db_url)
    try:
        for desc in (False, True):
            for flt in (EpisodeFilter(), EpisodeFilter(iteration=1)):  # the sort's walk; a filter's index
                seen, cursor = [], None
                while True:
                    page = episode_page(db, RUN, flt, Sort("tool_calls", desc), cursor, limit=2)
                    seen += [(r.episode_id, page.tool_calls[r.episode_id]) for r in page.rows]
                    if (cursor := page.next_cursor) is None:
                        break
                want = [e for e in BY_CALLS if flt.iteration is None or "/it1/" in e]
                assert seen == [(e, TOTALS[e]) for e in (want[::-1] if desc else want)], (desc, flt)
        with TestClient(create_app(db, allowed_hosts=["testserver"])) as client:
            text = client.get("/episodes", params={"run": RUN, "sort": "tool_calls", "desc": "true"}).text
            assert re.findall(r'data-testid="episode-tool-calls">(\d+)<', text) == ["5", "3", "2", "0", "0", "0"]
            forked = client.get("/episode", params={"id": FORKED}).text
            assert forked.count('data-testid="episode-counter"') == len(COUNTERS)
    finally:
        db.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ViewerServer]:
    yield from serve_filled(fill, tmp_path_factory, "tool-calls-view")


def test_the_browser_sorts_by_tool_calls_and_shows_a_forked_episode(page, server: ViewerServer) -> None:
    page.goto(f"{server.base}/episodes?run={RUN}")
    share = page.get_by_test_id("no-tool-share")
    assert share.inner_text() == "50%" and share.get_attribute("data-without") == "3"
    page.get_by_test_id("sort").select_option("tool_calls")
    page.get_by_test_id("sort-desc").check()
    page.get_by_test_id("apply-filters").click()
    page.wait_for_url(re.compile(r"sort=tool_calls.*desc=true"))
    rows = page.get_by_test_id("episode-row")
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.episodeId)") == BY_CALLS[::-1]
    assert page.get_by_test_id("episode-tool-calls").all_inner_texts() == ["5", "3", "2", "0", "0", "0"]

    page.locator(f'[data-testid="episode-row"][data-episode-id="{FORKED}"]').get_by_test_id("episode-link").click()
    page.wait_for_url(re.compile(r"/episode\?"))
    assert page.get_by_test_id("episode-tool-calls").inner_text() == "3"
    assert page.get_by_test_id("turn-branch").all_inner_texts() == ["branch 0", "branch 1", "branch 0", "branch 2"]
    assert page.get_by_test_id("episode-branches").inner_text().startswith("3 branches:")
    tree = [" ".join(t.split()) for t in page.get_by_test_id("branch-summary").all_inner_texts()]
    fork = "(a history that extends no earlier branch: compacted, edited, or a sub-agent's)"
    assert tree == ["branch 0: turns 0, 2", f"└ branch 1, forked at turn 1 {fork}: turn 1",
                    f"└ branch 2, forked at turn 3 {fork}: turn 3"]
    counters = page.get_by_test_id("episode-counter")
    assert dict(zip(counters.evaluate_all("rs => rs.map(r => r.dataset.key)"),
                    counters.locator("td:nth-child(2)").all_inner_texts())) == \
        {k: f"{v:g}" for k, v in COUNTERS.items()}
    page.locator('[data-testid="branch-summary"][data-branch="0"] a', has_text="2").click()
    page.wait_for_url(re.compile(r"#turn-2$"))
    assert page.locator("#turn-2").is_visible()
    assert page.get_by_test_id("token").count() == sum(3 + 2 for _ in CALLS[FORKED])  # the token view, every token
    page.get_by_test_id("token").first.hover()
    assert page.get_by_test_id("token-info").inner_text() != "hover a token"
    assert page.page_errors == [] and page.dialogs == []

