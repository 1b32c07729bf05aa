"""``StreamingEnginePool`` on real Ray with stand-in engine actors (each finishes an episode a
few collects after it was submitted, no vLLM), so an engine can be killed at a known moment;
the real streaming engines run in test_async_train.py. An engine lost while streaming turns
every request it held into an aborted episode (stored, never scored) and a retry with
``attempt + 1`` on the remaining engine, as ``EnginePool.rollout`` does in sync mode."""

from __future__ import annotations

import time

import ray

from agentrl.cluster.engines.stream import StreamingEnginePool
from agentrl.config import load_config
from agentrl.tasks import TaskSource
from agentrl.types import Episode, TerminationReason, Turn


@ray.remote(max_concurrency=4)
class _StandInEngine:
    def __init__(self, index: int) -> None:
        self.index, self.version, self.running, self.done = index, 0, {}, []

    def ready(self) -> float:
        return 0.0

    def node(self) -> dict:
        return {"engine_index": self.index, "node_id": "stand-in", "node_ip": "127.0.0.1", "pid": 0}

    def set_policy_version(self, v: int) -> None:
        self.version = v

    def stream_start(self) -> None:
        pass

    def stream_submit(self, requests) -> None:
        for r in requests:
            self.running[r.episode_id] = (r, 2)

    def stream_collect(self, wait_s: float) -> list:
        time.sleep(min(wait_s, 0.05))
        out = []
        for eid, (r, left) in list(self.running.items()):
            if left > 1:
                self.running[eid] = (r, left - 1)
                continue
            del self.running[eid]
            out.append(Episode(group_id=r.group_id, env_id=r.env_id, task_id=r.task_id, seed=r.seed,
                               turns=[Turn(prompt_ids=[1], completion_ids=[2], behavior_log_probs=[-1.0],
                                           policy_version=self.version, reward=0.0)],
                               terminated=True, termination_reason=TerminationReason.ENV_TERMINATED,
                               episode_id=r.episode_id))
        return out

    def stream_stop(self) -> list:
        out = [r for r, _ in self.running.values()]
        self.running = {}
        return out

    def held(self) -> int:
        return len(self.running)


class _Pool(StreamingEnginePool):
    def _start_actor(self, index: int):
        return _StandInEngine.remote(index)


def test_an_engine_lost_while_streaming_aborts_its_requests_and_retries_them(ray_session, tmp_path):
    cfg = load_config(None, [f"run.dir={tmp_path}", "rollout.num_engines=2", "controller.mode=async",
                             "env.group_size=2", "sandbox.backend=bwrap", "eval.before_training=false",
                             "eval.after_training=false"])  # no eval engine beside the stand-ins
    pool = _Pool(cfg, cfg.model_dump(mode="json"), "unused", "run")
    try:
        pool.ready()
        pool.stream_start(3)
        reqs = TaskSource("agentrl/GuessNumber-v0", ["a", "b"], seed=0, group_size=2, run_id="run").next_requests(2)
        pool.stream_submit(reqs)
        assert pool.in_flight() == 4 and sorted(pool.loads().values()) == [2, 2]  # least-loaded: two each
        lost = pool.actors[0]
        held = ray.get(lost.held.remote())
        ray.kill(lost)
        finished, aborted, retries = [], [], []
        deadline = time.monotonic() + 60
        while len(finished) < 4 and time.monotonic() < deadline:
            eps, again = pool.collect(0.2)
            finished += [e for e in eps if e.termination_reason != TerminationReason.ABORTED]
            aborted += [e for e in eps if e.termination_reason == TerminationReason.ABORTED]
            retries += again
        assert pool.engines_lost == 1 and pool.engine_indices == [1]
        assert len(aborted) == held == len(retries) == 2
        assert all(e.error["engine_index"] == "0" and not e.turns for e in aborted)
        assert [r.attempt for _, r in retries] == [1, 1]
        assert {a for a, _ in retries} == {e.episode_id for e in aborted}
        # every request answered once by a finished episode: the lost ones by their retries
        assert sorted(e.episode_id for e in finished) == sorted(
            [r.episode_id for r in reqs if r.episode_id not in {e.episode_id for e in aborted}]
            + [r.episode_id for _, r in retries])
        assert {e.turns[0].policy_version for e in finished} == {3}  # the stream's version, set at start
        assert pool.in_flight() == 0 and pool.stream_stop() == []
    finally:
        pool.kill()

