"""The viewer's reads of tool calls, branches and counters (schema 9), on a SQLite store filled
through its own API: the episode list's tool-call counts and its sort by them (keyset pages,
with and without a filter's index), the share of episodes without a tool call, the episode
view's branches and counters, and the pages that show them (HTTP, no browser). A database
left at schema 8 and opened read-only reads as one branch, 0 tool calls and no counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agentrl.errors import ContractError
from agentrl.replay import ReplayStore
from agentrl.replay.read import EpisodeFilter, ReadOnlyDB, ReplayDB, Sort, episode_page, episode_view
from agentrl.replay.read.listing import tool_call_share
from agentrl.replay.viewer import create_app
from agentrl.types import Episode, TerminationReason, Turn
from tests.helpers.replay_schema import downgrade

RUN = "r"
CALLS = {"r/it1/g/0/a0": [2, 0, 1, 0], "r/it1/g/1/a0": [0, 0], "r/it1/g/2/a0": [5], "r/it1/g/3/a0": [0],
         "r/it2/g/0/a0": [1, 1]}
"""Episode id → tool calls per turn; the first episode also forks (branches 0, 1, 0, 2)."""
BRANCHES = [0, 1, 0, 2]
COUNTERS = {"gateway/forks": 2.0, "gateway/calls": 4.0, "gateway/tool_parse_errors": 0.0}


def _episode(eid: str, calls: list[int]) -> Episode:
    forked = eid == "r/it1/g/0/a0"
    # a gateway episode's observations are the messages the agent's next call added
    obs = (lambda k: json.dumps([["tool", f"out {k}"], ["user", "go on"]])) if forked else (lambda k: f"o{k}")
    turns = [Turn([1, 2, k], [4, 5], [-0.25, -0.5], reward=0.0, action_text=f"a{k}", tool_calls=n,
                  branch=BRANCHES[k] if forked else 0, observation_text=obs(k))
             for k, n in enumerate(calls)]
    return Episode(group_id="g", env_id="x/E-v0", task_id=f"t-{eid}", seed=3, turns=turns, terminated=True,
                   termination_reason=TerminationReason.ENV_TERMINATED, episode_id=eid,
                   counters=dict(COUNTERS) if forked else {})


def fill(url: str) -> str:
    """Run ``r`` (the episodes of ``CALLS`` and one eval episode without a tool call) and run
    ``other`` into the replay database ``url``, through the store; returns ``url``."""
    with ReplayStore(url) as store:
        store.start_run(RUN, {})
        store.add_episodes(RUN, 1, [_episode(e, c) for e, c in CALLS.items() if "/it1/" in e])
        store.add_episodes(RUN, 2, [_episode(e, c) for e, c in CALLS.items() if "/it2/" in e])
        store.add_episodes(RUN, 2, [_episode("r/eval/it2/g/0/a0", [0, 0])], kind="eval")
        store.start_run("other", {})
        store.add_episodes("other", 1, [_episode("other/it1/g/0/a0", [9])])
    return url


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory):
    rdb = ReadOnlyDB(fill(f"sqlite:///{tmp_path_factory.mktemp('tool-calls') / 'replay.db'}"))
    yield rdb
    rdb.close()


def _walk(db: ReplayDB, sort: Sort, f: EpisodeFilter = EpisodeFilter(), limit: int = 2) -> tuple[list[str], dict]:
    """Every episode id of the listing, page after page, and their tool-call counts."""
    ids: list[str] = []
    calls: dict[str, int] = {}
    cursor = None
    while True:
        page = episode_page(db, RUN, f, sort, cursor, limit)
        assert set(page.tool_calls) == {r.episode_id for r in page.rows}
        ids += [r.episode_id for r in page.rows]
        calls.update(page.tool_calls)
        cursor = page.next_cursor
        if cursor is None:
            return ids, calls


def test_the_listing_counts_each_episodes_tool_calls_and_sorts_by_them(db: ReplayDB) -> None:
    totals = {e: sum(c) for e, c in CALLS.items()} | {"r/eval/it2/g/0/a0": 0}
    ids, calls = _walk(db, Sort())
    assert calls == totals and sorted(ids) == sorted(totals)
    expected = sorted(totals, key=lambda e: (totals[e], e))
    for limit in (1, 2, 50):
        assert _walk(db, Sort("tool_calls"), limit=limit)[0] == expected
        assert _walk(db, Sort("tool_calls", desc=True), limit=limit)[0] == expected[::-1]
    # an iteration filter read through its index (few rows): the page sorts what it finds
    it1 = [e for e in expected if "/it1/" in e]
    assert _walk(db, Sort("tool_calls"), EpisodeFilter(iteration=1), limit=1)[0] == it1
    assert _walk(db, Sort("tool_calls"), EpisodeFilter(kind="eval"))[0] == ["r/eval/it2/g/0/a0"]
    page = episode_page(db, RUN, EpisodeFilter(), Sort(), limit=1)
    with pytest.raises(ContractError, match="sort='tool_calls'"):  # a cursor of another sort is refused
        episode_page(db, RUN, EpisodeFilter(), Sort("tool_calls"), page.next_cursor)


def test_the_share_of_episodes_without_a_tool_call(db: ReplayDB) -> None:
    share = tool_call_share(db, RUN)
    assert (share.episodes, share.without, share.more) == (6, 3, False) and share.share == 0.5
    newest = tool_call_share(db, RUN, max_episodes=3)  # iteration 2 (eval, it2/g/0), then it1/g/3
    assert (newest.episodes, newest.without, newest.more) == (3, 2, True)
    assert (tool_call_share(db, RUN, kind="train").without, tool_call_share(db, RUN, kind="eval").without) == (2, 1)
    assert tool_call_share(db, "other").without == 0
    none = tool_call_share(db, "no-such-run")
    assert (none.episodes, none.share) == (0, None)
    with pytest.raises(ContractError, match="max_episodes=0"):
        tool_call_share(db, RUN, max_episodes=0)
    with pytest.raises(ContractError, match="kind='bogus'"):
        tool_call_share(db, RUN, kind="bogus")


def test_the_episode_view_has_branches_tool_calls_and_counters(db: ReplayDB) -> None:
    ep = episode_view(db, "r/it1/g/0/a0")
    assert ep.branches == {0: [0, 2], 1: [1], 2: [3]}
    assert [t.row.branch for t in ep.turns] == BRANCHES and [t.row.tool_calls for t in ep.turns] == [2, 0, 1, 0]
    assert ep.tool_calls == 3 and ep.counters == COUNTERS
    plain = episode_view(db, "r/it1/g/1/a0")
    assert plain.branches == {0: [0, 1]} and plain.tool_calls == 0 and plain.counters == {}
    assert episode_view(db, "nope") is None


def test_the_pages_show_tool_calls_branches_and_counters(db: ReplayDB) -> None:
    client = TestClient(create_app(db, allowed_hosts=["testserver"]))
    page = client.get("/episodes", params={"run": RUN, "sort": "tool_calls", "desc": "true"})
    assert page.status_code == 200, page.text[-500:]
    assert "<th>tool calls</th>" in page.text and 'data-without="3" data-episodes="6"' in page.text
    cells = page.text.split('data-testid="episode-tool-calls">')[1:]
    assert [c.split("<")[0] for c in cells] == ["5", "3", "2", "0", "0", "0"]
    assert 'data-without="1" data-episodes="1"' in client.get(
        "/episodes", params={"run": RUN, "kind": "eval"}).text
    assert client.get("/episodes", params={"run": RUN, "kind": "bogus"}).status_code == 200
    forked = client.get("/episode", params={"id": "r/it1/g/0/a0"}).text
    assert "3 branches: " in forked and forked.count('data-testid="branch-summary"') == 3
    assert '<a href="#turn-0">0</a>, <a href="#turn-2">2</a>' in forked
    assert "branch 1, forked at turn 1" in forked and "branch 2, forked at turn 3" in forked
    # the observations of a gateway episode read as messages, each with its role
    roles = [s.split('"')[0] for s in forked.split('data-testid="turn-message" data-role="')[1:]]
    assert roles == ["tool", "user"] * 4 and "out 3" in forked and 'data-testid="turn-observation"' not in forked
    assert [s.split('"')[0] for s in forked.split('data-testid="turn-branch" data-branch="')[1:]] == ["0", "1", "0", "2"]
    assert forked.count('data-testid="episode-counter"') == 3 and "gateway/tool_parse_errors" in forked
    assert 'data-testid="episode-tool-calls">3<' in forked and "2 tool calls" in forked and "1 tool call<" in forked
    assert 'data-testid="token-view"' in forked  # the token view is still there
    plain = client.get("/episode", params={"id": "r/it1/g/1/a0"}).text
    assert "branches:" not in plain and 'data-testid="turn-branch"' not in plain
    assert 'data-testid="turn-message"' not in plain and plain.count('data-testid="turn-observation"') == 2
    assert 'data-testid="episode-counters"' not in plain and 'data-testid="turn-tool-calls"' not in plain
    run = client.get("/run", params={"id": RUN})
    assert run.status_code == 200, run.text[-500:]
    assert 'data-testid="run-no-tool-calls"' in run.text and 'data-testid="no-tool-share"' in run.text


def test_a_schema_8_database_reads_as_one_branch_without_tool_calls_or_counters(tmp_path: Path) -> None:
    url = fill(f"sqlite:///{tmp_path / 'replay.db'}")
    downgrade(url, "0008")
    before = (tmp_path / "replay.db").read_bytes()
    db = ReadOnlyDB(url)
    try:
        assert "tool_calls" not in db.turn_columns and "counters" not in db.episode_columns
        everyone = sorted(list(CALLS) + ["r/eval/it2/g/0/a0"])
        for desc in (False, True):
            ids, calls = _walk(db, Sort("tool_calls", desc=desc))
            assert ids == (everyone[::-1] if desc else everyone) and set(calls.values()) == {0}
        assert _walk(db, Sort("tool_calls"), EpisodeFilter(iteration=1), limit=1)[0] == \
            [e for e in everyone if "/it1/" in e]
        share = tool_call_share(db, RUN)
        assert (share.episodes, share.without) == (6, 6)
        ep = episode_view(db, "r/it1/g/0/a0")
        assert ep.branches == {0: [0, 1, 2, 3]} and ep.tool_calls == 0 and ep.counters == {}
        client = TestClient(create_app(db, allowed_hosts=["testserver"]))
        for path, params in (("/episodes", {"run": RUN, "sort": "tool_calls"}), ("/episode", {"id": "r/it1/g/0/a0"}),
                             ("/run", {"id": RUN})):
            got = client.get(path, params=params)
            assert got.status_code == 200, (path, got.text[-500:])
    finally:
        db.close()
    assert (tmp_path / "replay.db").read_bytes() == before  # read-only: not upgraded
