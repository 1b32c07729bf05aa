"""The viewer's request guards and run-page links, at the HTTP level over real SQLite files:
``/diagnose`` leaves the file as found (no WAL switch, no -wal/-shm), foreign Host headers get
400 (DNS rebinding), integers beyond 64 bits get 400 naming the parameter, and the run page
draws the held-out eval pass@1 beside the train reward with links that keep train and eval
episodes apart; a turn left out of the loss shows no advantage and loss mask 0."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import html
import pytest
from fastapi.testclient import TestClient

from agentrl.replay import ReplayStore
from agentrl.replay.read import ReadOnlyDB
from agentrl.replay.viewer import create_app

from tests.integration.viewer.viewer_data import episode, fill

HUGE = "99999999999999999999999"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def delete_journal_db(tmp_path: Path) -> Path:
    """The viewer data in a SQLite file switched back to journal_mode=DELETE (as a copy or an
    older tool may leave it), with no -wal/-shm beside it."""
    path = tmp_path / "replay.db"
    store = ReplayStore(f"sqlite:///{path}")
    try:
        fill(store)
    finally:
        store.close()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    con.close()
    assert not (tmp_path / "replay.db-wal").exists() and not (tmp_path / "replay.db-shm").exists()
    return path


def test_diagnose_page_leaves_the_file_as_found(delete_journal_db: Path) -> None:
    before = _digest(delete_journal_db)
    db = ReadOnlyDB(f"sqlite:///{delete_journal_db}")
    try:
        with TestClient(create_app(db, allowed_hosts=["testserver"])) as c:
            r = c.get("/diagnose?run=run-a")
            assert r.status_code == 200, r.text
            assert 'data-testid="finding"' in r.text
    finally:
        db.close()
    d = delete_journal_db.parent
    assert sorted(p.name for p in d.iterdir()) == ["replay.db"]  # no -wal, no -shm, no journal
    assert _digest(delete_journal_db) == before
    con = sqlite3.connect(delete_journal_db)
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        con.close()


@pytest.fixture(scope="module")
def small_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReadOnlyDB]:
    path = tmp_path_factory.mktemp("viewer-fixes") / "replay.db"
    store = ReplayStore(f"sqlite:///{path}")
    try:
        fill(store)
        # a run that evaluates after each iteration (agentrl.commands.evaluate): eval episodes
        # stored at the iteration they follow, kind='eval', and its eval/pass@1 metrics
        store.start_run("run-e", {"env": {"id": "agentrl/Test-v0"}, "controller": {"mode": "sync"}})
        for it in range(2):
            store.add_episodes("run-e", it, [episode(f"e{it}-t-{i}", "task-0", f"e{it}-g", reward=0.5)
                                             for i in range(3)])
            store.add_episodes("run-e", it, [episode(f"e{it}-v-{i}", "task-1", f"e{it}-vg", reward=1.0)
                                             for i in range(2)], kind="eval")
            store.add_metrics("run-e", it, {"rollout/reward_mean": 0.5, "rollout/success_rate": 0.25,
                                            "eval/pass@1": 0.4 + 0.1 * it, "eval/pass@1_low": 0.2 + 0.1 * it,
                                            "eval/pass@1_high": 0.6 + 0.1 * it})
        # a run with a difficulty profile (kind='profile') and an eval before training only (kind='eval',
        # eval_before/* metrics), both stored with iteration 1's rows as the loop stores them (iterations
        # are numbered from 1): no eval/* metric, other kinds beside its training rows
        store.start_run("run-p", {"env": {"id": "agentrl/Test-v0"}, "controller": {"mode": "sync"}})
        store.add_episodes("run-p", 1, [episode(f"p-t-{i}", "task-0", "p-g", reward=0.5) for i in range(2)])
        store.add_episodes("run-p", 1, [episode(f"p-p-{i}", "task-1", "p-pg", reward=0.0) for i in range(3)],
                           kind="profile")
        store.add_episodes("run-p", 1, [episode(f"p-v-{i}", "task-1", "p-vg", reward=1.0) for i in range(2)],
                           kind="eval")
        store.add_metrics("run-p", 1, {"rollout/reward_mean": 0.5, "rollout/success_rate": 0.0,
                                       "time/profile_s": 1.0, "time/eval_before_s": 2.0,
                                       "tokens/profile_generated": 30.0})
    finally:
        store.close()
    db = ReadOnlyDB(f"sqlite:///{path}")
    yield db
    db.close()


@pytest.fixture(scope="module")
def client(small_db: ReadOnlyDB) -> Iterator[TestClient]:
    with TestClient(create_app(small_db, allowed_hosts=["testserver"])) as c:
        yield c


def test_a_foreign_host_header_gets_400(small_db: ReadOnlyDB) -> None:
    app = create_app(small_db)  # no test host: loopback names only
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        assert c.get("/").status_code == 200
        assert c.get("/", headers={"host": "localhost:8765"}).status_code == 200
        assert c.get("/", headers={"host": "[::1]:8765"}).status_code == 200
        r = c.get("/", headers={"host": "rebind.attacker.example"})
        assert r.status_code == 400 and "run-a" not in r.text
        assert c.get("/run?id=run-a", headers={"host": "rebind.attacker.example:8765"}).status_code == 400
        assert c.get("/", headers={"host": "10.1.2.3:8765"}).status_code == 400
    with TestClient(create_app(small_db, host="10.1.2.3"), base_url="http://10.1.2.3:8765") as c:
        assert c.get("/").status_code == 200  # the --host it serves on
        assert c.get("/", headers={"host": "rebind.attacker.example"}).status_code == 400


@pytest.mark.parametrize("query, name", [
    (f"/episodes?run=run-a&iteration={HUGE}", "iteration"),
    (f"/episodes?run=run-a&length_min={HUGE}", "length_min"),
    (f"/episodes?run=run-a&length_max=-{HUGE}", "length_max"),
    (f"/episodes?run=run-a&policy_version={HUGE}", "policy_version"),
    (f"/episodes?run=run-a&limit={HUGE}", "limit"),
    (f"/episode?id=a0-0-0&tok={HUGE}", "tok"),
    (f"/diff?a=run-a&ia={HUGE}&b=run-b", "ia"),
    (f"/diagnose?run=run-a&max={HUGE}", "max"),
    (f"/episodes?run=run-a&iteration={2**63}", "iteration"),
])
def test_integers_beyond_64_bits_get_400_naming_the_parameter(client: TestClient, query: str, name: str) -> None:
    r = client.get(query)
    assert r.status_code == 400, (query, r.status_code, r.text[:300])
    assert f"parameter {name}=" in html.unescape(r.text)


def test_the_largest_64_bit_integer_is_a_filter(client: TestClient) -> None:
    r = client.get(f"/episodes?run=run-a&iteration={2**63 - 1}")
    assert r.status_code == 200 and 'data-testid="episode-row"' not in r.text


@pytest.mark.parametrize("sort, values", [
    ("default", [10**30, "2026-01-01T00:00:00+00:00", 0, "a0-0-0", 0]),
    ("length", [10**30, "a0-0-0", 0]),
    ("turns", [-(10**30), "a0-0-0", 0]),
])
def test_a_crafted_cursor_with_a_huge_integer_gets_400(client: TestClient, sort: str, values: list) -> None:
    cursor = base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")
    r = client.get(f"/episodes?run=run-a&sort={sort}&cursor={cursor}")
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert "cursor=" in html.unescape(r.text) and "2**63" in html.unescape(r.text)


def _points(page: str, chart: str) -> list[tuple[str, str]]:
    """``(title, href)`` of every chart point of ``chart`` on the run page."""
    start = page.index(f'data-testid="chart-{chart}"')
    end = page.find("</figure>", start)
    part = page[start:end if end > 0 else len(page)]
    return [(html.unescape(t), html.unescape(h)) for h, t in
            re.findall(r'<a href="([^"]*)" class="pt-link" data-testid="chart-point">.*?<title>([^<]*)</title>', part)]


def test_run_page_draws_eval_pass_at_1_and_links_train_and_eval_apart(client: TestClient) -> None:
    page = client.get("/run?id=run-e")
    assert page.status_code == 200
    pts = _points(page.text, "reward-iteration")
    evals = [(t, urlparse(h)) for t, h in pts if t.startswith("eval pass@1:")]
    trains = [(t, urlparse(h)) for t, h in pts if t.startswith("reward:")]
    assert len(evals) == 2 and len(trains) == 2
    assert any(t.startswith("eval pass@1 95% low:") for t, _ in pts)
    assert any(t.startswith("eval pass@1 95% high:") for t, _ in pts)
    assert [parse_qs(u.query) for _, u in trains] == [{"run": ["run-e"], "iteration": [str(i)], "kind": ["train"]}
                                                      for i in range(2)]
    assert [parse_qs(u.query) for _, u in evals] == [{"run": ["run-e"], "iteration": [str(i)], "kind": ["eval"]}
                                                     for i in range(2)]
    # following the points shows only that kind's episodes
    ids = lambda h: sorted(html.unescape(m) for m in re.findall(  # noqa: E731
        r'data-testid="episode-row" data-episode-id="([^"]*)"', client.get(h).text))
    assert ids(trains[1][1].path + "?" + trains[1][1].query) == [f"e1-t-{i}" for i in range(3)]
    assert ids(evals[1][1].path + "?" + evals[1][1].query) == [f"e1-v-{i}" for i in range(2)]


def test_a_run_without_eval_keeps_its_plain_iteration_links(client: TestClient) -> None:
    pts = _points(client.get("/run?id=run-a").text, "reward-iteration")
    assert pts and not any(t.startswith("eval") for t, _ in pts)
    assert parse_qs(urlparse(pts[-1][1]).query) == {"run": ["run-a"], "iteration": ["1"]}


def test_a_run_with_profile_or_eval_before_episodes_links_its_train_points_to_train_episodes(client: TestClient) -> None:
    """A difficulty profile (``kind='profile'``) or an eval before training (``kind='eval'``,
    only ``eval_before/*`` metrics) stores episodes at the iteration beside its training rows:
    a train point must not list them as that iteration's rollouts."""
    pts = [(t, urlparse(h)) for t, h in _points(client.get("/run?id=run-p").text, "reward-iteration")]
    trains = [u for t, u in pts if t.startswith("reward:")]
    assert [parse_qs(u.query) for u in trains] == [{"run": ["run-p"], "iteration": ["1"], "kind": ["train"]}]
    rows = re.findall(r'data-testid="episode-row" data-episode-id="([^"]*)"',
                      client.get(trains[0].path + "?" + trains[0].query).text)
    assert sorted(html.unescape(m) for m in rows) == ["p-t-0", "p-t-1"]


def test_a_turn_left_out_of_the_loss_shows_no_advantage_and_mask_0(tmp_path: Path) -> None:
    """Overlong filtering leaves a cut turn out of the loss: its stored advantage is NULL (the
    credit result's None), the episode's mean is over the trained turns, and the episode page
    says so and draws that turn's sampled tokens with loss mask 0. An episode never trained
    (no advantages at all) keeps the contract's mask, 1 on every sampled token."""
    path = tmp_path / "replay.db"
    with ReplayStore(f"sqlite:///{path}") as store:
        store.start_run("run-o", {})
        cut, never = episode("cut-1", "t0", "g0", 1.0), episode("never-1", "t0", "g0", 0.0)
        store.add_episodes("run-o", 0, [cut, never], {"cut-1": [0.5, None]})
        assert store.list_episodes("run-o")[0].advantage_mean == 0.5
        assert store.get_advantages("cut-1") == [0.5, None]
    db = ReadOnlyDB(f"sqlite:///{path}")
    try:
        with TestClient(create_app(db, allowed_hosts=["testserver"])) as c:
            page = c.get("/episode?id=cut-1").text
            assert 'data-testid="turn-advantage">0.5<' in page and page.count('data-testid="turn-left-out"') == 1
            masks = [int(m) for m in re.findall(r'data-testid="token" [^>]*data-loss-mask="([01])"', page)]
            n0, n1 = len(cut.turns[0].completion_ids), len(cut.turns[1].completion_ids)
            p0, p1 = len(cut.turns[0].prompt_ids), len(cut.turns[1].prompt_ids)
            assert masks == [0] * p0 + [1] * n0 + [0] * (p1 + n1)
            other = c.get("/episode?id=never-1").text
            assert 'data-testid="turn-left-out"' not in other
            assert sum(int(m) for m in re.findall(r'data-loss-mask="([01])"', other)) == n0 + n1
    finally:
        db.close()
