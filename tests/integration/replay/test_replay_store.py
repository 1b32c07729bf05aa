"""ReplayStore against real databases: a SQLite file under tmp_path (always) and PostgreSQL
(when $AGENTRL_TEST_POSTGRES_URL names one; see conftest.py). No mocks."""

from __future__ import annotations

import math
import sqlite3
import struct
import threading
import time

import numpy as np
import pytest
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from agentrl.errors import ConfigError, ContractError, InfraError
from agentrl.replay import SCHEMA_VERSION, ReplayStore, RunStatus
from agentrl.replay.models import EpisodeRow, SandboxEventRow, SchemaVersionRow, TurnRow
from agentrl.replay.migrations import HEAD
from agentrl.types import Episode, ExecResult, SamplingRecord, TerminationReason, Turn


def _bits(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


def _row_count(store: ReplayStore, model: type) -> int:
    with store.engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(model)))


# -- round trip ------------------------------------------------------------------------


def test_multi_turn_episode_round_trips_exactly(store: ReplayStore) -> None:
    tricky_lps = [-1e-30, -0.0, 0.0, -5e-324, -1e-300, -123.45678901234567, -0.1 - 0.2,
                  float(np.float32(-0.3)), -1e-4 * 0.999, -math.pi]
    ep = Episode(
        group_id="g-1", env_id="agentrl/Code-v0", task_id="HumanEval/0 ünïcödé", seed=2**62,
        turns=[
            Turn(
                prompt_ids=[1, 2, 3, 49151], completion_ids=list(range(10, 20)),
                behavior_log_probs=tricky_lps,
                sampling=SamplingRecord(temperature=0.6, top_p=0.95, top_k=50),
                policy_version=3, finish_reason="stop", reward=0.0, anchor=(0, "start"),
                action_text="<bash>printf 'ok\\xff'</bash>",
                observation_text="ok\ufffd\x00tail \ud800 end",  # NUL and a lone surrogate
                exec_results=[
                    ExecResult(command="printf 'ok\\xff'", exit_code=0, stdout="ok\ufffd",
                               stderr="", duration_s=0.012345678901234567),
                    ExecResult(command=("sleep", "1000"), exit_code=None, stdout="",
                               stderr="killed\x00", duration_s=2.0000001, timed_out=True,
                               truncated_bytes=123_456_789_012),
                ],
            ),
            Turn(
                prompt_ids=[], completion_ids=[7], behavior_log_probs=[-2.5],
                policy_version=4, finish_reason="length", reward=-0.5, anchor=42,
                invalid_action=True, action_text="garbage", observation_text="",
            ),
            Turn(
                prompt_ids=[5] * 300, completion_ids=[0, 2**31 - 1], behavior_log_probs=[-1.0, -0.0],
                policy_version=4, finish_reason="abort", reward=1.25, anchor="plain str",
                exec_results=[ExecResult(command=("python3", "-c", "print(1)"), exit_code=137,
                                         stdout="1\n", stderr="", duration_s=0.0)],
            ),
        ],
        terminated=False, truncated=True, termination_reason=TerminationReason.LENGTH,
    )
    ep.validate()
    store.start_run("run-rt", {"lr": 1e-6, "model": "SmolLM2-135M"})
    store.add_episodes("run-rt", 0, [ep])

    got = store.get_episode(ep.episode_id)

    assert got == ep
    for g, e in zip(got.turns, ep.turns):
        assert _bits(g.behavior_log_probs) == _bits(e.behavior_log_probs)
        assert all(type(x) is int for x in g.prompt_ids + g.completion_ids)
        assert g.exec_results == e.exec_results
        assert type(g.anchor) is type(e.anchor)
    assert got.token_ids() == ep.token_ids()
    assert got.loss_mask() == ep.loss_mask()
    assert sum(got.loss_mask()) == len(got.behavior_log_probs()) == 13
    assert got.total_reward == 0.75
    assert got.turns[0].exec_results[1].command == ("sleep", "1000")  # argv stays a tuple
    assert math.copysign(1.0, got.turns[0].behavior_log_probs[1]) == -1.0


def test_anchor_that_is_not_a_literal_reads_back_as_its_repr(store: ReplayStore, make_episode) -> None:
    ep = make_episode(0, num_turns=2)
    ep.turns[0].anchor = frozenset({3})
    ep.turns[1].anchor = (1, (2.5, None, b"x"), True)
    store.start_run("run-a", {})
    store.add_episodes("run-a", 0, [ep])
    got = store.get_episode(ep.episode_id)
    assert got.turns[0].anchor == "frozenset({3})"
    assert got.turns[1].anchor == (1, (2.5, None, b"x"), True)


def test_episodes_and_summaries_of_a_realistic_batch(store: ReplayStore, make_episode) -> None:
    eps = [make_episode(i) for i in range(8)]
    store.start_run("run-b", {})
    assert store.add_episodes("run-b", 5, eps) == 0
    for ep in eps:
        assert store.get_episode(ep.episode_id) == ep
    summaries = store.list_episodes("run-b")
    assert [s.episode_id for s in summaries] == [e.episode_id for e in eps]
    s, e = summaries[3], eps[3]
    assert (s.run_id, s.iteration, s.group_id, s.env_id, s.task_id, s.seed) == (
        "run-b", 5, e.group_id, e.env_id, e.task_id, e.seed)
    assert (s.num_turns, s.num_generated_tokens) == (3, e.num_generated_tokens())
    assert (s.policy_version_min, s.policy_version_max) == (0, 1)
    assert s.total_reward == e.total_reward == 1.0
    assert s.termination_reason is TerminationReason.ENV_TERMINATED and not s.is_error
    assert s.created_at.tzinfo is not None
    assert _row_count(store, SandboxEventRow) == 8 * 3 * 2


# -- errors are never a reward of 0 -----------------------------------------------------


def test_errored_episodes_keep_error_info_and_no_reward(store: ReplayStore, make_episode) -> None:
    infra = Episode(group_id="g", env_id="agentrl/Bash-v0", task_id="t", seed=0, turns=[],
                    termination_reason=TerminationReason.INFRA_ERROR,
                    error={"type": "SandboxError", "message": "container exited 137"})
    reward_err = make_episode(1, termination_reason=TerminationReason.REWARD_ERROR,
                              error={"type": "RewardError", "message": "verifier timed out"})
    reward_err.turns[-1].reward = None
    zero = make_episode(2)  # a genuine reward of 0
    assert zero.total_reward == 0.0
    store.start_run("run-err", {})
    store.add_episodes("run-err", 0, [infra, reward_err, zero])

    got_infra = store.get_episode(infra.episode_id)
    assert got_infra == infra
    assert got_infra.total_reward is None and got_infra.is_error
    assert got_infra.error == {"type": "SandboxError", "message": "container exited 137"}
    assert store.get_episode(reward_err.episode_id).turns[-1].reward is None

    by_id = {s.episode_id: s for s in store.list_episodes("run-err")}
    assert by_id[infra.episode_id].total_reward is None
    assert by_id[infra.episode_id].is_error and by_id[infra.episode_id].num_turns == 0
    assert by_id[infra.episode_id].policy_version_min is None
    assert by_id[reward_err.episode_id].total_reward is None
    assert by_id[reward_err.episode_id].termination_reason is TerminationReason.REWARD_ERROR
    assert by_id[zero.episode_id].total_reward == 0.0 and not by_id[zero.episode_id].is_error
    with store.engine.connect() as conn:
        stored = {r.episode_id: r.total_reward for r in conn.execute(select(EpisodeRow.episode_id, EpisodeRow.total_reward))}
    assert stored[infra.episode_id] is None and stored[reward_err.episode_id] is None
    assert stored[zero.episode_id] == 0.0


# -- idempotence and resume ---------------------------------------------------------------


def test_re_adding_episodes_replaces_them_without_duplicates(store: ReplayStore, make_episode) -> None:
    eps = [make_episode(i) for i in range(4)]
    store.start_run("run-idem", {})
    store.add_episodes("run-idem", 0, eps)
    counts = [_row_count(store, m) for m in (EpisodeRow, TurnRow, SandboxEventRow)]
    assert counts == [4, 12, 24]

    eps[2].turns[-1].reward = 0.25  # the replayed iteration carries newer data
    eps[2].turns[0].exec_results = eps[2].turns[0].exec_results[:1]
    assert store.add_episodes("run-idem", 0, eps) == 4

    assert [_row_count(store, m) for m in (EpisodeRow, TurnRow, SandboxEventRow)] == [4, 12, 23]
    assert store.count_episodes("run-idem") == 4
    assert store.get_episode(eps[2].episode_id) == eps[2]
    assert [s.episode_id for s in store.list_episodes("run-idem")] == [e.episode_id for e in eps]


def test_episode_id_collisions_are_refused_and_nothing_is_written(store: ReplayStore, make_episode) -> None:
    a, b = make_episode(0), make_episode(1)
    store.start_run("run-1", {})
    store.start_run("run-2", {})
    store.add_episodes("run-1", 0, [a])
    with pytest.raises(ContractError, match=a.episode_id):
        store.add_episodes("run-2", 0, [b, a])
    with pytest.raises(ContractError, match="more than once"):
        store.add_episodes("run-2", 0, [b, b])
    assert store.count_episodes("run-2") == 0
    assert store.list_episodes("run-1")[0].run_id == "run-1"


def test_resume_keeps_the_run_row(store: ReplayStore) -> None:
    first = store.start_run("run-res", {"iterations": 3})
    store.finish_run("run-res", RunStatus.INTERRUPTED)
    assert store.get_run("run-res").finished_at is not None
    again = store.start_run("run-res", {"iterations": 6})
    assert again.created_at == first.created_at
    assert (again.status, again.resume_count, again.config) == (RunStatus.RUNNING, 1, {"iterations": 6})
    store.finish_run("run-res", "finished")
    info = store.get_run("run-res")
    assert info.status is RunStatus.FINISHED and info.finished_at >= info.created_at
    assert [r.run_id for r in store.runs()] == ["run-res"]
    with pytest.raises(ContractError, match=r"status='done'.*'finished'"):
        store.finish_run("run-res", "done")


# -- advantages --------------------------------------------------------------------------


def test_advantages_are_stored_per_turn(store: ReplayStore, make_episode) -> None:
    eps = [make_episode(i, num_turns=2) for i in range(3)]
    store.start_run("run-adv", {})
    store.add_episodes("run-adv", 0, eps, advantages={eps[0].episode_id: [0.5, -1e-30],
                                                      eps[1].episode_id: [0.0, 0.0]})
    assert _bits(store.get_advantages(eps[0].episode_id)) == _bits([0.5, -1e-30])
    assert store.get_advantages(eps[2].episode_id) == [None, None]
    means = {s.episode_id: s.advantage_mean for s in store.list_episodes("run-adv")}
    assert means == {eps[0].episode_id: 0.25, eps[1].episode_id: 0.0, eps[2].episode_id: None}

    with pytest.raises(ContractError, match="1 advantages for 2 turns"):
        store.add_episodes("run-adv", 1, [eps[0]], advantages={eps[0].episode_id: [1.0]})
    with pytest.raises(ContractError, match="advantage=nan is not finite"):
        store.add_episodes("run-adv", 1, [eps[0]], advantages={eps[0].episode_id: [1.0, math.nan]})
    with pytest.raises(ContractError, match="not in the batch"):
        store.add_episodes("run-adv", 1, [eps[0]], advantages={"nope": [1.0]})


# -- metrics -------------------------------------------------------------------------------


def test_metrics_round_trip_and_overwrite(store: ReplayStore, make_episode) -> None:
    store.start_run("run-m", {})
    store.add_metrics("run-m", 0, {"actor/pg_loss": 0.125, "rollout/reward_mean": np.float32(0.5)})
    store.add_metrics("run-m", 1, {"actor/pg_loss": -0.0625, "actor/ppo_kl": math.nan,
                                   "grad/norm": math.inf})
    store.add_metrics("run-m", 0, {"actor/pg_loss": 0.25})  # replayed after a resume
    store.add_episodes("run-m", 2, [make_episode(0)])

    m = store.metrics("run-m")
    assert list(m) == [0, 1]
    assert m[0] == {"actor/pg_loss": 0.25, "rollout/reward_mean": 0.5}
    assert m[1]["actor/pg_loss"] == -0.0625 and m[1]["grad/norm"] == math.inf
    assert math.isnan(m[1]["actor/ppo_kl"])
    assert store.iterations("run-m") == [0, 1, 2]
    assert store.metrics("no-such-run") == {}
    with pytest.raises(ContractError, match=r"metric 'x'='high' is not a real number"):
        store.add_metrics("run-m", 3, {"x": "high"})
    with pytest.raises(ContractError, match="run_id='ghost'"):
        store.add_metrics("ghost", 0, {"x": 1.0})


# -- listing -------------------------------------------------------------------------------


def test_listing_with_pagination(store: ReplayStore, make_episode) -> None:
    store.start_run("run-l", {})
    batches = {0: [make_episode(i, num_turns=1, events_per_turn=0) for i in range(7)],
               1: [make_episode(i, num_turns=1, events_per_turn=0) for i in range(7, 13)]}
    store.add_episodes("run-l", 0, batches[0][:4])
    store.add_episodes("run-l", 1, batches[1])
    store.add_episodes("run-l", 0, batches[0][4:])  # a late batch of iteration 0
    expected = [e.episode_id for e in batches[0] + batches[1]]

    pages = [store.list_episodes("run-l", limit=5, offset=o) for o in range(0, 15, 5)]
    assert [len(p) for p in pages] == [5, 5, 3]
    assert [s.episode_id for p in pages for s in p] == expected
    assert [s.episode_id for s in store.list_episodes("run-l", iteration=1, limit=4, offset=4)] == expected[11:13]
    assert store.list_episodes("run-l", iteration=9) == []
    assert store.count_episodes("run-l") == 13
    assert store.count_episodes("run-l", iteration=0) == 7
    assert store.iterations("run-l") == [0, 1]
    with pytest.raises(ContractError, match="limit=-1"):
        store.list_episodes("run-l", limit=-1)


# -- bad input -----------------------------------------------------------------------------


def test_bad_input_is_refused_with_a_clear_error(store: ReplayStore, make_episode) -> None:
    with pytest.raises(ContractError, match="run_id='nope'.*start_run"):
        store.add_episodes("nope", 0, [make_episode(0)])
    store.start_run("run-bad", {})
    big = make_episode(0)
    big.turns[1].completion_ids[0] = 2**31
    with pytest.raises(ContractError, match=r"turn 1 completion_ids contain 2147483648"):
        store.add_episodes("run-bad", 0, [make_episode(1), big])
    nan_reward = make_episode(2)
    nan_reward.turns[0].reward = math.nan
    with pytest.raises(ContractError, match="reward=nan is not finite"):
        store.add_episodes("run-bad", 0, [nan_reward])
    broken = make_episode(3)
    broken.turns[0].behavior_log_probs.pop()
    with pytest.raises(ContractError, match="behavior_log_probs"):
        store.add_episodes("run-bad", 0, [broken])
    with pytest.raises(ContractError, match="iteration=-1"):
        store.add_episodes("run-bad", -1, [make_episode(4)])
    with pytest.raises(ContractError, match="seed=True"):
        store.add_episodes("run-bad", 0, [make_episode(5, seed=True)])
    with pytest.raises(ContractError, match="not JSON-serializable"):
        store.start_run("run-bad2", {"f": object()})
    with pytest.raises(ContractError, match="episode_id='missing'"):
        store.get_episode("missing")
    assert store.count_episodes("run-bad") == 0
    assert _row_count(store, TurnRow) == 0
    numpy_ints = make_episode(6, seed=np.int64(7))  # numpy integers are fine
    store.add_episodes("run-bad", np.int64(2), [numpy_ints])
    assert store.iterations("run-bad") == [2]
    assert type(store.get_episode(numpy_ints.episode_id).seed) is int


def test_bad_urls_raise_config_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not a database URL"):
        ReplayStore("replay.db")
    with pytest.raises(ConfigError, match="in-memory"):
        ReplayStore("sqlite://")
    with pytest.raises(ConfigError, match="driver not available"):
        ReplayStore("postgresql+nosuchdriver://u@h/db")
    with pytest.raises(InfraError, match="cannot open the replay database"):
        ReplayStore(f"sqlite:///{tmp_path}")  # a folder, not a file


# -- schema version ------------------------------------------------------------------------


def test_a_database_newer_than_the_code_is_refused_naming_both_revisions(db_url: str) -> None:
    with ReplayStore(db_url) as store:
        store.start_run("run-v", {})
        with store.engine.begin() as conn:  # as a later agentrl would leave it
            conn.execute(text("UPDATE alembic_version SET version_num = '0047'"))
    for read_only in (False, True):
        with pytest.raises(ContractError) as info:
            ReplayStore(db_url, read_only=read_only)
        msg = str(info.value)
        assert "'0047'" in msg and f"{HEAD!r}" in msg and "newer than this agentrl" in msg


def test_schema_version_out_of_step_with_the_revision_is_refused(db_url: str) -> None:
    with ReplayStore(db_url) as store:
        with store.engine.begin() as conn:
            conn.execute(update(SchemaVersionRow).values(version=SCHEMA_VERSION + 41))
    with pytest.raises(ContractError) as info:
        ReplayStore(db_url)
    msg = str(info.value)
    assert f"schema_version {SCHEMA_VERSION + 41}" in msg and f"schema_version {SCHEMA_VERSION}" in msg


def test_reopening_keeps_data_and_version(db_url: str, make_episode) -> None:
    ep = make_episode(0)
    with ReplayStore(db_url) as store:
        store.start_run("run-o", {})
        store.add_episodes("run-o", 0, [ep])
    with ReplayStore(db_url) as store:
        assert store.get_episode(ep.episode_id) == ep
        with store.engine.connect() as conn:
            assert conn.scalar(select(SchemaVersionRow.version)) == SCHEMA_VERSION


def test_unversioned_database_with_replay_tables_is_refused(tmp_path) -> None:
    path = tmp_path / "foreign.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY)")
    with pytest.raises(ContractError, match=r"\['runs'\] but no schema_version table"):
        ReplayStore(f"sqlite:///{path}")


# -- SQLite specifics ----------------------------------------------------------------------


def test_sqlite_uses_wal_and_enforces_foreign_keys(tmp_path) -> None:
    path = tmp_path / "sub" / "dir" / "replay.db"  # parent folders are created
    with ReplayStore(f"sqlite:///{path}") as store:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        with pytest.raises(IntegrityError):
            with store.engine.begin() as conn:
                conn.execute(insert(TurnRow).values(
                    episode_id="ghost", turn_index=0, prompt_ids=b"", completion_ids=b"",
                    behavior_log_probs=b"", temperature=1.0, top_p=1.0, top_k=-1, policy_version=0,
                    finish_reason="stop", reward=None, anchor="", anchor_kind="str",
                    action_text="", observation_text="", invalid_action=False, advantage=None))
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent


def test_processes_opening_a_new_database_at_once_all_succeed(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'replay.db'}"
    barrier, errors, stores = threading.Barrier(4), [], []

    def open_store() -> None:
        barrier.wait()
        try:
            stores.append(ReplayStore(url))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with stores[0].engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(SchemaVersionRow)) == 1
    for st in stores:
        st.close()


def test_sqlite_reader_keeps_its_snapshot_while_the_writer_commits(tmp_path, make_episode) -> None:
    """WAL + the store's own BEGIN: an open read transaction is not blocked by a write and
    keeps seeing the state it started with (the sqlite3 module alone would not BEGIN
    before a SELECT, so its second read would see the new rows)."""
    url = f"sqlite:///{tmp_path / 'replay.db'}"
    with ReplayStore(url) as writer, ReplayStore(url) as viewer:
        writer.start_run("run-s", {})
        writer.add_episodes("run-s", 0, [make_episode(0)])
        count = select(func.count()).select_from(EpisodeRow)
        with viewer.engine.begin() as conn:
            assert conn.scalar(count) == 1
            writer.add_episodes("run-s", 1, [make_episode(1), make_episode(2)])  # not blocked
            assert conn.scalar(count) == 1
        assert viewer.count_episodes("run-s") == 3


def test_concurrent_reader_sees_only_whole_batches(tmp_path, make_episode) -> None:
    """The controller writes from one thread while a viewer (a second store on the same
    file, as another process would have) reads: every read sees whole batches only."""
    url = f"sqlite:///{tmp_path / 'replay.db'}"
    writer, viewer = ReplayStore(url), ReplayStore(url)
    writer.start_run("run-c", {})
    batch_size, num_batches = 8, 12
    batches = [[make_episode(b * batch_size + i, num_turns=2) for i in range(batch_size)]
               for b in range(num_batches)]
    by_id = {e.episode_id: e for b in batches for e in b}
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for it, batch in enumerate(batches):
                writer.add_episodes("run-c", it, batch)
                writer.add_metrics("run-c", it, {"n": float(it)})
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    seen_counts, checked = [], 0
    try:
        while thread.is_alive() or not seen_counts or seen_counts[-1] < batch_size * num_batches:
            n = viewer.count_episodes("run-c")
            assert n % batch_size == 0, f"a reader saw a partial batch: {n} episodes"
            seen_counts.append(n)
            for s in viewer.list_episodes("run-c", limit=3, offset=max(0, n - 3)):
                assert viewer.get_episode(s.episode_id) == by_id[s.episode_id]
                checked += 1
            if not thread.is_alive() and n == batch_size * num_batches:
                break
    finally:
        thread.join()
        writer.close()
        viewer.close()
    assert not errors, errors
    assert seen_counts == sorted(seen_counts)
    assert seen_counts[-1] == batch_size * num_batches and checked > 0
    print(f"\nviewer polled {len(seen_counts)} times, compared {checked} episodes while writing")


# -- bulk insert speed (printed, not asserted) ----------------------------------------------


def test_bulk_insert_timing(store: ReplayStore, make_episode) -> None:
    store.start_run("run-bulk", {})
    batch64 = [make_episode(i, num_turns=3, events_per_turn=3) for i in range(64)]
    batch256 = [make_episode(i, num_turns=3, events_per_turn=3) for i in range(64, 320)]
    adv = {e.episode_id: [0.1, -0.2, 0.3] for e in batch256}

    t0 = time.perf_counter()
    store.add_episodes("run-bulk", 0, batch64)
    t64 = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.add_episodes("run-bulk", 1, batch256, advantages=adv)
    t256 = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.add_episodes("run-bulk", 1, batch256, advantages=adv)
    t256_again = time.perf_counter() - t0

    assert store.count_episodes("run-bulk") == 320
    assert _row_count(store, SandboxEventRow) == 320 * 3 * 3
    assert store.get_episode(batch256[-1].episode_id) == batch256[-1]
    with store.engine.connect() as conn:
        dialect = conn.dialect.name
    print(f"\n[{dialect}] add_episodes: 64 eps x 3 turns x 3 events {t64 * 1e3:.1f} ms; "
          f"256 eps {t256 * 1e3:.1f} ms; re-add (replace) 256 eps {t256_again * 1e3:.1f} ms")
