"""Per-token policy versions in the replay store (schema version 5): a turn that spans a
weight update round-trips its ``policy_versions``; the episode summary's version range is
over tokens; a version-4 database (no ``turns.policy_versions`` column) is upgraded in place (to Alembic's head)
and its turns read back with every token at the turn's version. Real databases (SQLite, and
PostgreSQL when $AGENTRL_TEST_POSTGRES_URL is set; see conftest.py)."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, select, text, update

from agentrl.replay import SCHEMA_VERSION, ReplayStore
from agentrl.replay.migrations import HEAD, current_revision
from tests.integration.replay.conftest import make_pre_alembic
from agentrl.replay.models import SchemaVersionRow, TurnRow


def test_a_turn_spanning_a_weight_update_keeps_each_tokens_version(store: ReplayStore, make_episode) -> None:
    ep = make_episode(0)
    t = ep.turns[1]
    n = len(t.completion_ids)
    t.policy_versions = [t.policy_version] * 5 + [t.policy_version + 2] * (n - 5)
    ep.validate()
    store.start_run("run-v", {})
    store.add_episodes("run-v", 0, [ep])
    back = store.get_episode(ep.episode_id)
    assert back == ep and back.turns[1].policy_versions == t.policy_versions
    assert back.policy_version_range() == ep.policy_version_range()
    (summary,) = store.list_episodes("run-v")
    assert (summary.policy_version_min, summary.policy_version_max) == ep.policy_version_range()
    with store.engine.connect() as conn:  # single-version turns store NULL (no extra bytes per token)
        stored = dict(conn.execute(select(TurnRow.turn_index, TurnRow.policy_versions)).all())
    assert stored[0] is None and stored[1] is not None and len(stored[1]) == 4 * n


def test_a_version_4_database_is_upgraded_in_place(db_url: str, make_episode) -> None:
    ep = make_episode(1)
    with ReplayStore(db_url) as store:
        store.start_run("run-old", {})
        store.add_episodes("run-old", 0, [ep])
    make_pre_alembic(db_url)
    engine = create_engine(db_url)
    with engine.begin() as conn:  # make it what schema_version 4 was: no policy_versions column
        conn.execute(text("ALTER TABLE turns DROP COLUMN policy_versions"))
        conn.execute(update(SchemaVersionRow).values(version=4))
        assert "policy_versions" not in {c["name"] for c in inspect(conn).get_columns("turns")}
    engine.dispose()
    with ReplayStore(db_url) as store:
        with store.engine.connect() as conn:
            assert conn.scalar(select(SchemaVersionRow.version)) == SCHEMA_VERSION == 10
            assert current_revision(conn) == HEAD
        back = store.get_episode(ep.episode_id)
        assert back == ep  # every token at its turn's version, as stored before
        assert all(t.policy_versions == [t.policy_version] * len(t.completion_ids) for t in back.turns)
        store.add_episodes("run-old", 1, [make_episode(2, episode_id="after-upgrade")])
        assert store.get_episode("after-upgrade").turns[0].policy_versions
