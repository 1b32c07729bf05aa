"""The rollout session's bookkeeping (agentrl/rollout/session.py) with a scripted engine and
env, beside the real-engine tests (tests/integration/rollout/test_inflight_weight_load.py):
requests submitted while others run, ``step_once``, ``abort_all``, and weight loads with
requests in flight in the three modes (token concatenation, per-token versions, the
``max_tokens`` reduction and the continuation seed, the same episode id on restart).

The engine samples one token per step per request: id ``100 * weights + position`` with
log-prob ``-0.1 * (weights + 1)``, so every token says which weights sampled it; a request
stops (id ``STOP``) after ``answer_len`` tokens."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest

from agentrl.errors import ContractError, EngineError
from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.engine import Completion
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.rollout.session import RolloutSession, WeightLoad, segment_seed
from agentrl.types import EpisodeRequest, SamplingRecord, TerminationReason
from tests.helpers.char_tokenizer import STOP, CharTokenizer



class ScriptedEngine:
    """One token per request per step; ``weights`` is the version of the loaded weights."""

    def __init__(self, answer_len=4):
        self.answer_len, self.weights = answer_len, 0
        self.live: dict[str, dict] = {}
        self.adds: list[tuple[str, list[int], int, int]] = []
        self.steps = 0
        self.resets = 0
        self.step_sleep_s = 0.0

    def add(self, request_id, prompt_ids, *, sampling, max_tokens, stop_token_ids, seed=None):
        assert request_id not in self.live
        self.adds.append((request_id, list(prompt_ids), max_tokens, seed))
        self.live[request_id] = {"ids": [], "lps": [], "max": max_tokens, "prompt_len": len(prompt_ids)}

    def has_unfinished(self):
        return bool(self.live)

    def step(self):
        time.sleep(self.step_sleep_s)  # the stream tests: a step takes time, as a real one does
        self.steps += 1
        done = []
        for rid, r in list(self.live.items()):
            if r.get("frozen"):  # holds blocks, never scheduled (the failed-reset tests)
                continue
            n = len(r["ids"])
            r["ids"].append(STOP if n + 1 >= self.answer_len else 100 * self.weights + n + 10)
            r["lps"].append(-0.1 * (self.weights + 1))
            if r["ids"][-1] == STOP or len(r["ids"]) >= r["max"]:
                del self.live[rid]
                reason = "stop" if r["ids"][-1] == STOP else "length"
                done.append(Completion(rid, tuple(r["ids"]), tuple(r["lps"]), reason, STOP if reason == "stop" else None))
        return done

    def abort(self, ids):
        for rid in ids:
            self.live.pop(rid, None)

    def preempt(self, ids):
        out = [Completion(rid, tuple(self.live[rid]["ids"]), tuple(self.live[rid]["lps"]), "abort", None) for rid in ids]
        self.abort(ids)
        return out

    def update_weights(self, version):
        if self.live:
            raise EngineError(f"{len(self.live)} requests still hold KV blocks")
        self.weights = version
        self.resets += 1
        return "in_place"


class CountingEnv(gym.Env):
    """Ends after ``steps`` steps with reward 1 on the last; counts resets and closes."""

    log: list[str] = []

    def __init__(self, steps=2):
        self.steps, self.t, self.closed = steps, 0, False

    def reset(self, *, seed=None, options=None):
        self.t = 0
        CountingEnv.log.append(f"reset:{options['task_id']}")
        return f"task {options['task_id']}", {}

    def step(self, action):
        self.t += 1
        return "obs", float(self.t >= self.steps), self.t >= self.steps, False, {}

    def close(self):
        self.closed = True


def make(answer_len=4, steps=2, max_new_tokens=8):
    CountingEnv.log = []
    envs = []

    def factory(req):
        envs.append(CountingEnv(steps))
        return envs[-1], None

    engine = ScriptedEngine(answer_len)
    worker = RolloutWorker(engine, ChatTokenizer(CharTokenizer(), (STOP,)), factory,
                           RolloutLimits(max_turns=4, max_new_tokens=max_new_tokens, max_context_tokens=4096),
                           SamplingRecord(), env_workers=2)
    return RolloutSession(worker, 0), engine, envs


def reqs(*names):
    return [EpisodeRequest("x/E-v0", n, 0, f"g-{n}", sample_seed=10 + i, index=0) for i, n in enumerate(names)]


def run_until(session, cond, limit=500):
    out = []
    for _ in range(limit):
        if cond(out):
            return out
        out.extend(session.step_once(wait_s=0.5))
    raise AssertionError("condition not reached")


def until_generating(session, engine, n):
    return run_until(session, lambda _: len(engine.live) >= n and all(len(r["ids"]) >= 2 for r in engine.live.values()))


def test_requests_submitted_while_others_run_all_finish_with_their_ids():
    session, engine, envs = make()
    try:
        session.submit(reqs("a", "b"))
        until_generating(session, engine, 2)
        session.submit(reqs("c"))
        with pytest.raises(ContractError, match="more than once"):
            session.submit(reqs("a"))  # still in flight
        done = run_until(session, lambda out: len(out) == 3)
        assert sorted(e.task_id for e in done) == ["a", "b", "c"]
        assert session.in_flight() == 0
        for ep in done:
            assert ep.termination_reason == TerminationReason.ENV_TERMINATED and len(ep.turns) == 2
            assert all(t.policy_versions == [0] * len(t.completion_ids) for t in ep.turns)
            assert ep.policy_version_range() == (0, 0)
        session.wait_closed()
        assert all(env.closed for env in envs)
    finally:
        session.shutdown()


def test_continue_concatenates_the_turn_and_tags_each_token_with_its_version():
    session, engine, envs = make(answer_len=10, max_new_tokens=16)
    try:
        requests = reqs("a", "b")
        session.submit(requests)
        until_generating(session, engine, 2)
        partial = {rid: list(r["ids"]) for rid, r in engine.live.items()}
        orig = {a[0]: a for a in engine.adds}
        load = WeightLoad(apply=lambda: engine.update_weights(1), policy_version=1, mode="continue")
        session.request_load(load)
        done = {ep.episode_id: ep for ep in run_until(session, lambda out: len(out) == 2)}
        assert load.stats["preempted_requests"] == 2 and load.stats["prefix_reset_ok"] and engine.resets == 1
        assert session.policy_version == 1 and sorted(done) == sorted(r.episode_id for r in requests)
        for rid, ids in partial.items():
            eid, turn_idx = rid.rsplit(":", 1)
            ep, turn, k = done[eid], done[eid].turns[int(turn_idx)], len(ids)
            assert turn.completion_ids[:k] == ids  # kept, not resampled
            assert turn.completion_ids[k:] == [110 + i for i in range(9)] + [STOP]  # the new weights after
            assert turn.policy_versions == [0] * k + [1] * 10 and turn.policy_version == 0
            assert turn.behavior_log_probs[k - 1:k + 1] == [-0.1, -0.2]
            re_add = next(a for a in engine.adds if a[0] == f"{rid}.1")
            assert re_add[1] == orig[rid][1] + ids  # prompt + partial ids
            assert re_add[2] == orig[rid][2] - k  # max_tokens reduced by what was sampled
            req = next(r for r in requests if r.episode_id == eid)
            assert re_add[3] == segment_seed(req.sample_seed, int(turn_idx), 1) != orig[rid][3]
            assert all(v == 1 for t in ep.turns[int(turn_idx) + 1:] for v in t.policy_versions)
            assert ep.policy_version_range() == (0, 1)
            ep.validate()
            rows = ep.training_sequences([1.0] * len(ep.turns))
            assert rows[0].policy_version == 0 and max(rows[0].token_policy_versions) == 1
        assert CountingEnv.log.count("reset:a") == 1 and CountingEnv.log.count("reset:b") == 1  # envs stayed alive
    finally:
        session.shutdown()


def test_the_continuation_stops_at_the_turn_budget_less_what_was_sampled():
    session, engine, _ = make(answer_len=10, max_new_tokens=11)
    try:
        session.submit(reqs("a"))
        until_generating(session, engine, 1)
        (rid, r), = engine.live.items()
        k = len(r["ids"])
        session.request_load(WeightLoad(apply=lambda: engine.update_weights(1), policy_version=1))
        ep, = run_until(session, lambda out: len(out) == 1)
        turn = ep.turns[0]
        assert len(turn.completion_ids) == 11 and turn.finish_reason == "length"  # k + (11 - k): the whole budget
        assert turn.policy_versions == [0] * k + [1] * (11 - k) and k < 10
        assert ep.termination_reason == TerminationReason.LENGTH
    finally:
        session.shutdown()


def test_drain_lets_generations_finish_on_the_old_weights_and_holds_new_turns():
    session, engine, envs = make(answer_len=6)
    try:
        session.submit(reqs("a"))
        until_generating(session, engine, 1)
        load = WeightLoad(apply=lambda: engine.update_weights(1), policy_version=1, mode="drain")
        session.request_load(load)
        done = run_until(session, lambda out: len(out) == 1)
        assert load.stats["preempted_requests"] == 0 and load.stats["drain_s"] >= 0 and engine.resets == 1
        t0, t1 = done[0].turns
        assert t0.policy_versions == [0] * 6 and t1.policy_versions == [1] * 6  # turns never span versions
        assert t0.completion_ids == [10, 11, 12, 13, 14, STOP] and t1.completion_ids[0] == 110
        assert not any("." in a[0].rsplit(":", 1)[1] for a in engine.adds)  # nothing re-added
    finally:
        session.shutdown()


def test_restart_starts_the_episode_again_from_reset_under_the_new_weights():
    session, engine, envs = make(answer_len=6)
    try:
        session.submit(reqs("a", "b"))
        until_generating(session, engine, 2)
        load = WeightLoad(apply=lambda: engine.update_weights(1), policy_version=1, mode="restart")
        session.request_load(load)
        done = run_until(session, lambda out: len(out) == 2)
        assert load.stats["restarted_episodes"] == 2 and session.restarted_episodes == 2
        assert sorted(e.episode_id for e in done) == sorted(r.episode_id for r in reqs("a", "b"))  # same ids
        for ep in done:
            assert len(ep.turns) == 2 and all(v == 1 for t in ep.turns for v in t.policy_versions)
        assert CountingEnv.log.count("reset:a") == 2 and CountingEnv.log.count("reset:b") == 2
        session.wait_closed()
        assert all(env.closed for env in envs) and len(envs) == 4  # the first envs were closed too
    finally:
        session.shutdown()


def test_a_failed_prefix_reset_is_an_error_not_ignored():
    session, engine, _ = make(answer_len=6)
    try:
        session.submit(reqs("a"))
        until_generating(session, engine, 1)
        engine.live["intruder"] = {"ids": [], "lps": [], "max": 5, "prompt_len": 1, "frozen": True}  # holds blocks, not ours
        session.request_load(WeightLoad(apply=lambda: engine.update_weights(1), policy_version=1))
        with pytest.raises(EngineError, match="still hold KV blocks"):
            session.step_once(wait_s=0.1)
    finally:
        session.abort_all()
        session.shutdown()


def test_abort_all_aborts_the_engine_closes_envs_and_returns_unfinished_requests():
    session, engine, envs = make(answer_len=6, steps=3)
    try:
        session.submit(reqs("a", "b"))
        until_generating(session, engine, 2)
        back = session.abort_all()
        assert [r.task_id for r in back] == ["a", "b"] and not engine.live
        assert all(env.closed for env in envs) and session.in_flight() == 0
    finally:
        session.shutdown()


def test_a_step_past_env_timeout_s_fails_only_its_episode_and_its_env_is_never_closed():
    import threading

    release = threading.Event()
    session, engine, envs = make(answer_len=3, steps=2)
    session.worker.env_timeout_s = 0.3
    hung: list[CountingEnv] = []

    class HangingStep(CountingEnv):
        def step(self, action):
            release.wait()
            return super().step(action)

    def factory(req):
        env = HangingStep(2) if req.task_id == "a" else CountingEnv(2)
        (hung if req.task_id == "a" else envs).append(env)
        return env, None

    session.worker.env_factory = factory
    try:
        session.submit(reqs("a", "b", "c"))
        done = {e.task_id: e for e in run_until(session, lambda out: len(out) == 3, limit=50)}
        a = done["a"]
        assert a.termination_reason == TerminationReason.INFRA_ERROR and a.error["type"] == "EnvError"
        assert "x/E-v0.step of task 'a'" in a.error["message"] and "rollout.env_timeout_s=0.3;" in a.error["message"]
        assert all(done[t].termination_reason == TerminationReason.ENV_TERMINATED for t in "bc")
        assert session.timed_out_env_calls == 1 and session.in_flight() == 0
        session.submit(reqs("d"))  # a fresh pool: the stuck thread holds no new call up
        assert run_until(session, lambda out: len(out) == 1, limit=50)[0].termination_reason == TerminationReason.ENV_TERMINATED
        session.wait_closed()
        session.abort_all()
        assert all(env.closed for env in envs) and len(envs) == 3
        assert not hung[0].closed  # its step is still running: never closed under it
        release.set()
        deadline = time.monotonic() + 10
        while not hung[0].closed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hung[0].closed  # closed once the stuck call returned
    finally:
        release.set()
        session.shutdown()


def test_calls_queued_behind_stuck_threads_still_run_and_abort_all_waits_only_env_timeout_s():
    """Every pool thread stuck (two workers, two hanging resets): the calls queued behind them
    move to a fresh pool; ``abort_all`` gives a stuck call up after the limit."""
    import threading

    release = threading.Event()
    session, engine, envs = make(answer_len=3, steps=2)
    session.worker.env_timeout_s = 0.3
    hung: list[CountingEnv] = []

    class HangingReset(CountingEnv):
        def reset(self, *, seed=None, options=None):
            release.wait()
            return super().reset(seed=seed, options=options)

    def factory(req):
        env = HangingReset(2) if req.task_id.startswith("h") else CountingEnv(2)
        (hung if req.task_id.startswith("h") else envs).append(env)
        return env, None

    session.worker.env_factory = factory
    try:
        session.submit(reqs("h1", "h2", "b", "c"))  # b and c wait for a thread behind h1 and h2
        done = {e.task_id: e for e in run_until(session, lambda out: len(out) == 4, limit=50)}
        assert [done[t].termination_reason for t in ("h1", "h2")] == [TerminationReason.INFRA_ERROR] * 2
        assert [done[t].termination_reason for t in ("b", "c")] == [TerminationReason.ENV_TERMINATED] * 2
        session.wait_closed()
        session.submit(reqs("h3"))
        run_until(session, lambda _: hung and len(hung) == 3, limit=50)
        t0 = time.monotonic()
        back = session.abort_all()
        assert [r.task_id for r in back] == ["h3"] and time.monotonic() - t0 < 5
        assert not any(env.closed for env in hung)  # all still inside their reset
        release.set()
        deadline = time.monotonic() + 10
        while not all(env.closed for env in hung) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(env.closed for env in hung) and all(env.closed for env in envs)
    finally:
        release.set()
        session.shutdown()


def test_a_bad_mode_is_a_config_error_naming_it():
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="'pause' is not one of"):
        WeightLoad(apply=lambda: None, mode="pause")


# --- the stream's loop thread (agentrl/rollout/stream.py) over the same scripted parts ---

def test_the_stream_takes_requests_and_loads_at_any_time_and_stops_cleanly():
    from agentrl.errors import ClusterError
    from agentrl.rollout.stream import StreamRunner, LoadProxy

    session, engine, envs = make(answer_len=10, max_new_tokens=16, steps=1)
    session.shutdown()
    engine.step_sleep_s = 0.01
    stream = StreamRunner(session.worker, policy_version=3)
    with pytest.raises(ClusterError, match="not running"):
        stream.submit(reqs("a"))
    stream.start()
    stream.start()  # idempotent
    try:
        stream.submit(reqs("a", "b"))
        with pytest.raises(ContractError, match="still in flight"):
            stream.submit(reqs("a"))
        assert stream.in_flight() == 2 and stream.collect(0.0) == []
        got = []
        while len(engine.live) < 2:
            got += stream.collect(0.005)
        assert not got
        proxy = LoadProxy(stream, 4, "continue")
        engine.update_weights = lambda tensors, f=engine.update_weights: f(tensors)  # the proxy passes the tensors on
        assert proxy.update_weights(4) == "in_place"  # returns once the weights are live
        assert proxy.stats["policy_version"] == 4 and proxy.stats["preempted_requests"] == 2
        assert stream.policy_version == 4 and engine.weights == 4
        while len(got) < 2:
            got += stream.collect(5.0)
        assert stream.in_flight() == 0
        for ep in got:
            assert ep.policy_version_range() == (3, 4) and ep.turns[0].policy_version == 3
        stream.submit(reqs("c", "d"))
        while len(engine.live) < 2:
            assert not stream.collect(0.005)
        back = stream.stop()
        assert sorted(r.task_id for r in back) == ["c", "d"] and stream.in_flight() == 0 and not engine.live
        assert all(env.closed for env in envs)
    finally:
        stream.stop()


def test_a_dead_stream_raises_its_error_at_collect_and_fails_a_waiting_load():
    from agentrl.errors import ClusterError
    from agentrl.rollout.stream import StreamRunner

    session, engine, _ = make(answer_len=10, max_new_tokens=16, steps=1)
    session.shutdown()
    engine.step_sleep_s = 0.01
    stream = StreamRunner(session.worker)
    stream.start()
    try:
        stream.submit(reqs("a"))
        while not engine.live:
            assert not stream.collect(0.005)
        engine.live["intruder"] = {"ids": [], "lps": [], "max": 5, "prompt_len": 1, "frozen": True}
        with pytest.raises(EngineError, match="still hold KV blocks"):
            stream.load(WeightLoad(apply=lambda: engine.update_weights(1), policy_version=1))
        with pytest.raises(EngineError):
            stream.collect(1.0)
        with pytest.raises(ClusterError, match="died"):
            stream.submit(reqs("b"))
    finally:
        assert [r.task_id for r in stream.stop()] == ["a"]


def test_concurrent_starts_run_one_loop_thread():
    """The actor serves ``stream_start`` on several threads at once (its "stream" concurrency
    group): two loop threads stepping one engine corrupted vLLM's scheduler (a KeyError in
    ``update_from_output`` on a fresh clone's test run), so a start is one at a time."""
    import threading

    from agentrl.rollout.stream import StreamRunner

    session, engine, _ = make(answer_len=4, max_new_tokens=8, steps=1)
    session.shutdown()
    stream = StreamRunner(session.worker)
    gate = threading.Barrier(8)

    def start() -> None:
        gate.wait()
        stream.start()

    starters = [threading.Thread(target=start) for _ in range(8)]
    try:
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        loops = [t for t in threading.enumerate() if t.name == "agentrl-rollout-stream"]
        assert len(loops) == 1 and stream.running
    finally:
        stream.stop()
    assert not [t for t in threading.enumerate() if t.name == "agentrl-rollout-stream"]
