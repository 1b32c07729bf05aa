"""Asynchronous training (``controller.mode: async``: streaming rollout, bounded staleness) on real parts:
Ray, streaming vLLM engines (CPU, tiny model), the FSDP2 trainer, the SQLite replay store,
on GuessNumber (no sandbox: the cheapest built-in env). Two engines, so groups span engines
and weight loads land while episodes are in flight; ``max_staleness=1``.

From the metrics and the store: no trained row older than k, the staleness histogram counts
exactly the trained rows, per-token versions never decrease, every trained group is complete
(all its members trained, none aborted among them), and each group is trained at most once.

The chaos test runs ``agentrl train`` in async mode and SIGKILLs the driver
at four points (mid-rollout, mid-update, mid-sync, mid-checkpoint with the trainers' state
written but not the controller's; the complete-but-unnamed checkpoint is
test_resume_no_duplicates.py's, sync mode), resuming after each; ``run.checkpoint_every=2`` so a resume also drops iterations stored after the
checkpoint. From the store, the metrics and the checkpoints: every task instance handed out
was trained exactly once or is recorded as pending, the requests a checkpoint recorded came
back with the same episode ids, no group is duplicated or lost, each iteration's episodes and
metrics are stored once, and policy versions never go backwards. One more start is SIGTERMed
while its trainer step runs (the interrupt path: exit 130, the run marked interrupted, and the
resume still trains everything once). About 4-5 minutes on 2 cores (six starts of a run).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.helpers.train_cli import train_cli

pytestmark = pytest.mark.slow
K, TASKS, GROUP, ITERATIONS = 1, 2, 2, 4


def async_args(run_dir, tiny_model_path, *extra: str) -> list[str]:
    """The async run's overrides (shared with the chaos test)."""
    return [f"run.dir={run_dir}", f"run.iterations={ITERATIONS}", "run.seed=0", f"model.path={tiny_model_path}",
            "env.id=agentrl/GuessNumber-v0", f"env.tasks_per_iteration={TASKS}", f"env.group_size={GROUP}",
            "rollout.max_turns=2", "rollout.max_new_tokens=8", "rollout.max_context_tokens=1024",
            "rollout.num_engines=2", "trainer.micro_batch_size=2", "controller.mode=async",
            f"controller.max_staleness={K}", "eval.before_training=false", "eval.after_training=false", *extra]


def trained_episodes(store, run_id):
    """Every stored episode with its iteration, trained or not (``advantage_mean`` is set on
    the trained ones only)."""
    return store.list_episodes(run_id, limit=100_000)


def check_async_run(run_dir, run_id, store, *, k: int = K) -> dict[str, int]:
    """The checks shared by the async tests; returns each trained group's training count."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [round(x["iteration"]) for x in lines] == list(range(1, len(lines) + 1))
    versions = [round(x["policy_version"]) for x in lines]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)  # never backwards, one per update
    trained_groups: Counter[str] = Counter()
    for it, m in enumerate(lines, start=1):  # iterations are numbered from 1
        v = round(m["policy_version"]) - 1  # the version the update started from
        eps = [e for e in trained_episodes(store, run_id) if e.iteration == it]
        trained = [e for e in eps if e.advantage_mean is not None]
        assert trained, f"iteration {it} trained nothing"
        rows = [e.policy_version_min for e in trained]
        assert all(v - r <= k for r in rows), (it, v, rows)  # invariant 9
        hist = {int(key.rsplit("/", 1)[1]): n for key, n in m.items() if key.startswith("async/staleness_hist/")}
        assert hist == dict(Counter(v - r for r in rows))  # full_history: one row per episode
        assert m["async/staleness_max"] == max(v - r for r in rows) <= k
        assert m["async/stale_dropped"] == 0  # the admission rule left nothing to drop
        per_group = Counter(e.group_id for e in trained)
        assert set(per_group.values()) == {GROUP}  # every trained group complete
        trained_groups.update(per_group.keys())
        for s in trained:
            ep = store.get_episode(s.episode_id)
            toks = [pv for t in ep.turns for pv in t.policy_versions]
            assert toks == sorted(toks) and toks[0] == s.policy_version_min and toks[-1] <= v
        for key in ("async/in_flight", "async/buffered_groups", "async/admission_wait_s", "async/preempted_requests",
                    "async/restarted_episodes", "timeline/rollout_start_s", "timeline/update_end_s",
                    "timeline/sync_end_s"):
            assert key in m, key
        assert m["timeline/rollout_start_s"] <= m["timeline/credit_start_s"] <= m["timeline/update_start_s"] \
            <= m["timeline/update_end_s"] <= m["timeline/sync_end_s"]
    assert max(trained_groups.values()) == 1  # each group trained at most once
    return dict(trained_groups)


EVAL_EVERY = 2
EVAL_ARGS = [f"eval.every={EVAL_EVERY}", "eval.before_training=true", "eval.split=test", "eval.num_tasks=2", "eval.samples=2", "eval.max_turns=3",
             "eval.max_new_tokens=24", "eval.max_context_tokens=512"]


def check_async_evals(run_dir, run_id, store, iterations: int = ITERATIONS, every: int = EVAL_EVERY) -> dict[int, int]:
    """Eval during async training (``agentrl.driver.dedicated_eval``): each
    landed eval's episodes carry exactly the version it claims (every sampled token) and are
    stored as kind 'eval' with the line that reports it; every due eval landed once or was
    counted skipped; the driver blocked on evals only in the last line, which carries the
    final version's eval; the loop went on while an eval ran; each checkpoint records exactly
    the evals not landed by then (what a resume reruns or drops: unit tests in
    tests/unit/driver/test_async_eval.py). Returns {iteration of the landing line: version
    evaluated} (iterations numbered from 1, as the lines' ``iteration`` and the store's rows)."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [round(m["iteration"]) for m in lines] == list(range(1, len(lines) + 1))
    line = {round(m["iteration"]): m for m in lines}  # iteration -> its metrics line
    landed = {it: round(m["eval/policy_version"]) for it, m in line.items() if m.get("eval/policy_version") is not None}
    due = set(range(every, iterations + 1, every))
    # eval.before_training: the starting policy (version 0), once, in some line (keys eval_before/*)
    (before,) = [it for it, m in line.items() if m.get("eval_before/policy_version") is not None]
    assert line[before]["eval_before/policy_version"] == 0 and "eval_before/pass@2" in line[before]
    assert landed[iterations] == iterations  # the last line: the final policy, after waiting for it
    assert set(landed.values()) <= due and len(set(landed.values())) == len(landed)
    assert len(landed) + sum(m["async/eval_skipped"] for m in lines) == len(due)  # each due eval landed or skipped
    assert all(m["async/eval_dropped"] == m["async/eval_failed"] == 0 for m in lines)
    assert all(m["time/eval_wait_s"] == 0 for m in lines[:-1])  # training never waited for an eval
    for it, v in landed.items():
        m = line[it]
        assert m["eval/iteration"] == v <= round(m["policy_version"]) and "eval/pass@2" in m and m["time/eval_s"] > 0
        assert m["eval/samples_scored"] + m["eval/samples_errored"] == 4
        assert m["timeline/eval_start_s"] >= line[v]["timeline/sync_end_s"] - 1e-6  # after v's sync (iteration v's)
        if v < iterations:  # the loop went on: the next iteration started before the eval was done
            assert m["timeline/eval_end_s"] > line[v + 1]["timeline/rollout_start_s"]
    evals = [e for e in store.list_episodes(run_id, limit=100_000) if e.kind == "eval"]
    at_start = [e for e in evals if "/eval-before/" in e.episode_id]
    assert len(at_start) == 4 and {e.iteration for e in at_start} == {before}  # stored with the line reporting it
    assert all(f"{run_id}/eval-before/it0/" in e.episode_id for e in at_start)  # ids: iteration 0, before training
    assert {(e.policy_version_min, e.policy_version_max) for e in at_start} == {(0, 0)}
    evals = [e for e in evals if "/eval-before/" not in e.episode_id]
    assert sorted({e.iteration for e in evals}) == sorted(landed)  # stored with the line that reports them
    for it, v in landed.items():
        mine = [e for e in evals if e.iteration == it]
        assert len(mine) == 4 and all(f"{run_id}/eval/it{v}/" in e.episode_id for e in mine)  # ids: the measured iteration
        for e in mine:  # one policy version: every sampled token's, equal to the claimed one
            ep = store.get_episode(e.episode_id)
            assert {pv for t in ep.turns for pv in t.policy_versions} == {v}, (it, v, e.episode_id)
    kept = sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("iter_*"))
    assert kept and kept[-1] == iterations
    for ck in kept:  # each checkpoint (after iteration ck) records the evals not landed by iteration ck's line
        state = json.loads((run_dir / "checkpoints" / f"iter_{ck}" / "controller.json").read_text())
        recorded = {p["policy_version"] for p in state["eval"]["pending"] if p["name"] == "eval"}
        landed_by_then = {v for it, v in landed.items() if it <= ck}
        landed_later = {v for it, v in landed.items() if it > ck}
        assert landed_later & {v for v in due if v <= ck} <= recorded  # in flight then, so recorded
        assert recorded <= {v for v in due if v <= ck} - landed_by_then, (ck, recorded, landed)  # never a landed one
        assert ck < iterations or recorded == set()  # the last line waited for every eval
    return landed


def test_async_training_keeps_the_staleness_bound(ray_session, tmp_path, tiny_model_path):
    """Two streaming engines, ``max_staleness=1``, and evaluation during training
    (``eval.every=2``) on a dedicated eval engine beside them (one run for both: CI time)."""
    from agentrl.driver.controller import train
    from agentrl.config import load_config
    from agentrl.replay import ReplayStore

    run_dir = tmp_path / "async"
    summary = train(load_config(None, async_args(run_dir, tiny_model_path, *EVAL_ARGS)))
    assert summary.iterations_done == ITERATIONS and summary.policy_version == ITERATIONS
    with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}") as store:
        groups = check_async_run(run_dir, summary.run_id, store)
        assert len(groups) >= TASKS * ITERATIONS
        assert store.completed_iterations(summary.run_id) == list(range(1, ITERATIONS + 1))
        check_async_evals(run_dir, summary.run_id, store)
    state = json.loads((run_dir / "checkpoints" / f"iter_{ITERATIONS}" / "controller.json").read_text())
    pending = {r["group_id"] for r in state["async"]["pending_requests"]}
    assert pending.isdisjoint(groups)  # what was admitted and not trained is recorded, not trained
    # the task cursor handed out exactly the trained and the pending instances, each once
    assert {int(g.split("@")[1]) for g in set(groups) | pending} == set(range(state["tasks"]["cursor"]))


def test_async_mode_actors_get_their_share_of_the_cores(ray_session, tmp_path):
    """On the local instance in async mode the engines and the trainer rank run at the same
    time, so role_options gives each its share of the cores (``cpu_threads``), and a Ray
    worker started with them sees exactly that (over the job's OMP_NUM_THREADS), and torch
    runs that many threads; sync mode keeps every core for the rank."""
    import os

    from agentrl.cluster.actors.cpu_threads import role_threads
    from agentrl.cluster.actors.placement import role_options
    from agentrl.config import load_config

    @ray_session.remote(num_cpus=0)
    class Probe:
        def threads(self, load_torch: bool) -> tuple[str | None, int | None]:
            import os

            if not load_torch:
                return os.environ.get("OMP_NUM_THREADS"), None
            import torch

            return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()

    cores = len(os.sched_getaffinity(0))
    base = [f"run.dir={tmp_path}", "rollout.num_engines=2", "cluster.placement.rollout.num_cpus=1",
            "cluster.placement.trainer.num_cpus=2"]
    cfg = load_config(None, [*base, "controller.mode=async"])
    asked = [(role_options(cfg, "rollout", i), i == 0) for i in range(2)] + [(role_options(cfg, "trainer"), True)]
    probes = [Probe.options(runtime_env=o["runtime_env"]).remote() for o, _ in asked]
    got = ray_session.get([p.threads.remote(torch) for p, (_, torch) in zip(probes, asked)])
    for p in probes:
        ray_session.kill(p)
    want = [max(1, cores // 4), max(1, cores // 4), max(1, cores // 2)]  # num_cpus 1 + 1 + 2 of 4 shares
    assert [int(env) for env, _ in got] == want == [role_threads(cfg, r) for r in ("rollout", "rollout", "trainer")]
    assert got[0][1] == want[0] and got[2][1] == want[2]  # OpenMP runs that many
    assert sum(want) <= max(cores, 3)  # no oversubscription beyond one thread per actor
    sync = role_options(load_config(None, [*base, "controller.mode=sync"]), "trainer")
    assert sync["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == str(cores)

# -- chaos: SIGKILL the driver mid-rollout, -update, -sync and -checkpoint, resume after each --
CHAOS_ITERATIONS, CHAOS_CHECKPOINT_EVERY = 4, 2
CHAOS_KILLS = [  # (kill point, iterations whose episodes and metrics are written when it fires, signal)
    ("mid_rollout:it=3", 2, "KILL"),  # iteration 3's groups collected, its update not started
    # SIGTERM while the trainer step runs in its background thread: the driver leaves at once
    # (it used to wait for the step), marks the run interrupted, and the resume loses nothing
    ("mid_update:it=3", 2, "TERM"),
    ("mid_update:it=4", 3, "KILL"),  # the trainer step called, not returned (iteration 3 stored, not checkpointed)
    ("mid_sync:it=4", 3, "KILL"),  # the new weights in the engines, the version not recorded
    ("mid_checkpoint_state:it=4", 4, "KILL"),  # the trainers' state written, the controller's not
]
# ``mid_checkpoint`` (iter_4 complete on disk, ``latest`` still naming iter_2) runs through the
# same ``checkpoint_if_due`` in both modes; test_resume_no_duplicates.py kills there (sync mode),
# which keeps this test at six starts of ``agentrl train`` (one of them SIGTERMed)


def test_async_chaos_sigkill_then_resume_trains_each_task_instance_once(tmp_path, tiny_model_path):
    import signal

    from agentrl.replay import ReplayStore
    from agentrl.types import EpisodeRequest

    run_dir = tmp_path / "chaos"
    # one engine: each of the six starts costs an engine start; two engines stream in the test above
    args = [a for a in async_args(run_dir, tiny_model_path) if not a.startswith(("run.iterations=", "rollout.num_engines="))]
    args += [f"run.iterations={CHAOS_ITERATIONS}", f"run.checkpoint_every={CHAOS_CHECKPOINT_EVERY}", "run.name=chaos",
             "cluster.num_cpus=4"]
    reissued: dict[str, str] = {}  # episode id -> group id of the requests a checkpoint recorded as pending
    latest = "iter_2"  # every kill is after the first checkpoint and before the second
    for k, (kill_at, written, sig) in enumerate(CHAOS_KILLS):
        rc, out = train_cli(["--resume", str(run_dir)] if k else args, kill_at, kill_signal=sig)
        if sig == "TERM":  # the CLI's interrupt exit, after train()'s clean-up (the step is not awaited:
            # tests/unit/driver/test_async_interrupt.py)
            assert rc == 130 and "interrupted" in out, f"{kill_at}: rc={rc} {out[-3000:]}"
        else:
            assert rc == -signal.SIGKILL, f"{kill_at}: {out[-3000:]}"
        assert (run_dir / "checkpoints" / "latest").read_text().strip() == latest, kill_at
        done = int(latest.split("_")[1])
        state = json.loads((run_dir / "checkpoints" / latest / "controller.json").read_text())
        assert state["iteration"] == state["policy_version"] == done
        reissued.update({EpisodeRequest(**r).episode_id: r["group_id"] for r in state["async"]["pending_requests"]})
        if kill_at.startswith("mid_checkpoint_state"):  # trainers written, no controller state: not a checkpoint
            tmp = run_dir / "checkpoints" / f".iter_{written}.tmp"
            assert (tmp / "trainer").is_dir() and not (tmp / "controller.json").exists()
        if kill_at.startswith("mid_checkpoint:"):  # complete on disk but never named: a resume removes it
            assert (run_dir / "checkpoints" / f"iter_{written}" / "controller.json").is_file()
        # what the killed attempt wrote after the checkpoint is there, and none of it counts as complete
        lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [round(x["iteration"]) for x in lines] == list(range(1, written + 1)), kill_at
        first_lines = lines[:done] if k == 0 else first_lines
        assert lines[:done] == first_lines  # the checkpointed iterations' lines are kept as written
        with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}") as store:
            (run,) = store.runs()
            if sig == "TERM":
                assert store.get_run(run.run_id).status.value == "interrupted"
            # the store's rows are numbered from 1, as the lines' iteration and the checkpoints' iter_N
            assert store.completed_iterations(run.run_id) == list(range(1, done + 1))
            assert store.iterations(run.run_id) == list(range(1, written + 1))
            assert sorted(store.metrics(run.run_id)) == list(range(1, written + 1))
            assert store.count_episodes(run.run_id, complete_only=True) == sum(
                store.count_episodes(run.run_id, it) for it in range(1, done + 1))
    rc, out = train_cli(["--resume", str(run_dir)], None)
    assert rc == 0, out[-3000:]
    assert not list((run_dir / "checkpoints").glob(".*"))  # the half-written checkpoint is gone
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[:2] == first_lines
    with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}") as store:
        (run,) = store.runs()
        info = store.get_run(run.run_id)
        assert info.resume_count == len(CHAOS_KILLS) and info.status.value == "finished"
        every = list(range(1, CHAOS_ITERATIONS + 1))  # iterations are numbered from 1
        assert store.completed_iterations(run.run_id) == store.iterations(run.run_id) == every
        metrics = store.metrics(run.run_id)
        assert sorted(metrics) == every  # each iteration's metrics once, the same attempt's
        for it, line in enumerate(lines, start=1):
            assert metrics[it]["time/iteration_s"] == line["time/iteration_s"]
            assert store.count_episodes(run.run_id, it) == line["rollout/episodes"]  # each episode stored once
        groups = check_async_run(run_dir, run.run_id, store)  # bound, complete groups, each trained at most once
        stored = trained_episodes(store, run.run_id)
        assert len({e.episode_id for e in stored}) == len(stored)
        trained_ids = {e.episode_id for e in stored if e.advantage_mean is not None}
        # what a checkpoint recorded as admitted-but-untrained came back with the same episode ids:
        # each recorded group was trained in a later iteration under exactly those ids, or is pending still
        final = json.loads((run_dir / "checkpoints" / f"iter_{CHAOS_ITERATIONS}" / "controller.json").read_text())
        pending = {r["group_id"] for r in final["async"]["pending_requests"]}
        for eid, gid in reissued.items():
            assert (eid in trained_ids) if gid in groups else (gid in pending), (eid, gid)
    # every task instance the cursor handed out was trained exactly once or is still pending
    assert pending.isdisjoint(groups)
    assert {int(g.split("@")[1]) for g in set(groups) | pending} == set(range(final["tasks"]["cursor"]))
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [round(x["iteration"]) for x in lines] == list(range(1, CHAOS_ITERATIONS + 1))
