"""A rollout session: the agent loop's episode state machine, stepped one engine step at a
time, taking requests at any time and loading weights between engine steps.

``RolloutWorker.run`` (``agentrl.rollout.loop``) is a thin loop over it: submit the batch,
``step_once`` until nothing is in flight. The streaming actor (``agentrl.rollout.stream``)
keeps one session open, submits as requests arrive and loads new weights while episodes
are in flight, in one of three modes (``controller.partial_rollout``: what in-flight episodes do
at a weight load):

* ``continue`` (partial rollout across the update): every in-flight engine request is
  preempted (``VLLMEngine.preempt``: aborted, its sampled ids and behavior log-probs kept),
  the weights load, the prefix cache is reset (checked: nothing holds blocks any more),
  and each request is added again as its prompt + the ids sampled so far, with
  ``max_tokens`` reduced by them, a new seed (``segment_seed``) and those ids as its
  stop-string context (a tool call opened before the preemption keeps its JSON string
  state: ``agentrl.rollout.stop_strings``). The finished turn's
  ``completion_ids`` / ``behavior_log_probs`` are the concatenation and
  ``Turn.policy_versions`` says which tokens came from which version. Sandboxes stay alive.
  The continuation's prompt is prefilled again under the new weights, so no KV block of the
  old weights is reused (the design of AReaL's interruptible generation, Fu et al. 2025 §4.1).
* ``drain``: no new turn enters the engine; in-flight generations finish on the old
  weights; then the weights load and the held turns start under the new ones (turns never
  span versions; episodes may).
* ``restart``: every episode with a turn in the engine or sampled tokens is abandoned (its
  engine request aborted, env and sandbox closed) and started again from ``env.reset``
  under the new weights, with the same episode id (``restarted_episodes`` counts them).

Env calls run in a thread pool while the engine generates. One that runs longer than the
worker's ``env_timeout_s`` (``rollout.env_timeout_s``) ends its episode as ``infra_error``
with an ``EnvError`` naming the call, the task and the limit, and the rest go on (an env or
tool that hangs is the environment's fault, never the model's). A Python thread cannot be
stopped: the call is left running, its env and sandbox are closed only if it returns (a
close could race it), and every call not yet started moves to a fresh pool, so stuck
threads hold no one up. ``abort_all`` waits for running calls up to the same limit. A
process that exits normally still waits for a stuck thread; the rollout actors are killed
instead.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from agentrl.errors import ConfigError, ContractError, EnvError
from agentrl.rollout.engine import Completion
from agentrl.rollout.judging import apply_group_judgement, apply_judgement, judge_item, success_threshold_of
from agentrl.rollout.state import ActiveEpisode
from agentrl.types import Episode, EpisodeRequest, TerminationReason

log = logging.getLogger(__name__)

LoadMode = Literal["continue", "drain", "restart"]
LOAD_MODES: tuple[str, ...] = ("continue", "drain", "restart")
_SEED_MOD = 2**63 - 1
_NOT_ENV_CALLS = ("close", "judge", "judge_group")  # futures that are no env reset or step (no env_timeout_s)


def segment_seed(sample_seed: int, turn: int, segment: int) -> int:
    """Sampling seed of segment ``segment`` of turn ``turn`` (segment 0 is the turn's first
    engine request, seeded ``sample_seed * 1009 + turn`` as before partial rollouts existed;
    segment ``s >= 1`` is its continuation after the ``s``-th preemption). Deterministic, so
    a resumed run samples the same continuation."""
    base = sample_seed * 1009 + turn
    return base if segment == 0 else (base * 1_000_003 + segment) % _SEED_MOD


@dataclass
class WeightLoad:
    """One weight load handed to a session (``RolloutSession.request_load``).

    Attributes:
        apply: loads the weights into the engine and resets its prefix cache (e.g.
            ``lambda: engine.update_weights(views)``); returns the load method.
        policy_version: the engine's version after the load; ``None`` keeps it.
        mode: ``continue`` | ``drain`` | ``restart`` (module docstring).
        stats: filled when applied: ``method``, ``preempted_requests``,
            ``restarted_episodes``, ``drain_s`` (seconds from the request until in-flight
            generations had finished; 0 outside ``drain``), ``apply_s``, ``prefix_reset_ok``.
    """

    apply: Callable[[], Any]
    policy_version: int | None = None
    mode: str = "continue"
    stats: dict[str, Any] = field(default_factory=dict)
    requested_at: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if self.mode not in LOAD_MODES:
            raise ConfigError(f"weight load mode={self.mode!r} is not one of {list(LOAD_MODES)} "
                              "(controller.partial_rollout)")


class RolloutSession:
    """The episode state machine of one ``RolloutWorker`` (its engine, env factory, limits).

    Not thread-safe: one thread calls every method (the streaming actor's loop thread).

    Args:
        worker: the ``RolloutWorker`` whose helpers run the episodes.
        policy_version: the engine's weight version; turns queued from now on are tagged
            with it until a load changes it.
    """

    def __init__(self, worker: Any, policy_version: int) -> None:
        self.worker = worker
        self.engine = worker.engine
        self.policy_version = int(policy_version)
        self._active: dict[str, ActiveEpisode] = {}  # episode id -> ActiveEpisode, submitted and not finished
        self._by_request: dict[str, ActiveEpisode] = {}  # engine request id -> ActiveEpisode
        self._futures: dict[Future, tuple[str, ActiveEpisode]] = {}
        self._queue: list[ActiveEpisode] = []  # turns prepared, not yet added to the engine
        self._held: list[ActiveEpisode] = []  # drain: turns held back until the load
        self._restart_pending: set[str] = set()  # episode ids restarted once their env call returns
        self._load: WeightLoad | None = None
        self._all: list[ActiveEpisode] = []  # every state of this session (run's error path closes them all)
        self._pools = self._new_pools()
        self._done_early: list[ActiveEpisode] = []  # turns a load ended (their budget was used up), returned by step_once
        self.restarted_episodes = 0
        self.timed_out_env_calls = 0
        self._calls: dict[Future, Callable[[], Any]] = {}  # what each pending future runs (resubmitted after a pool swap)
        # a group-mode judge: requests of each group submitted here, and the members finished so far
        self._group_expected: dict[str, int] = {}
        self._group_done: dict[str, list[ActiveEpisode]] = {}
        self._judge_sent: dict[Future, float] = {}  # a judge future -> time.time() its episode(s) went to the judge

    def _new_pools(self) -> dict[str, ThreadPoolExecutor]:
        """Two thread pools of ``env_workers`` threads each: one runs resets, the other steps
        and closes. A reset may wait for what running episodes hold (a server's session slots,
        a sandbox pool): in one pool such waiting resets could take every thread while the
        steps that would end those episodes, and free what they hold, queue behind them."""
        n = self.worker.env_workers
        return {"reset": ThreadPoolExecutor(max_workers=n, thread_name_prefix="agentrl-env-reset"),
                "step": ThreadPoolExecutor(max_workers=n, thread_name_prefix="agentrl-env")}

    def _pool_for(self, kind: str) -> ThreadPoolExecutor:
        return self._pools["reset" if kind == "reset" else "step"]

    def _submit(self, kind: str, st: Any, fn: Callable[[], Any]) -> None:
        """Run ``fn`` (an env call of episode ``st``: ``reset``, ``step`` or ``close``) in the
        pool of its kind (``_new_pools``); the time it starts running is kept on ``st`` for
        ``env_timeout_s``."""
        def timed() -> Any:
            st.env_call_started = time.monotonic()
            try:
                return fn()
            finally:
                st.env_call_started = None

        fut = self._pool_for(kind).submit(timed)
        self._futures[fut] = (kind, st)
        self._calls[fut] = timed

    def _expire_env_calls(self) -> list[Any]:
        """End the episodes whose reset or step has run longer than ``env_timeout_s``
        (module docstring); returns their states, failed with ``infra_error``."""
        limit = self.worker.env_timeout_s
        if limit is None:
            return []
        now, out = time.monotonic(), []
        for fut, (kind, st) in list(self._futures.items()):
            if kind in _NOT_ENV_CALLS:
                continue
            started = st.env_call_started
            if started is None or fut.done() or now - started <= limit:
                continue
            del self._futures[fut]
            self._calls.pop(fut, None)
            self._restart_pending.discard(st.episode.episode_id)  # (still counted in restarted_episodes)
            self._abandon(st)
            self.timed_out_env_calls += 1
            err = EnvError(f"{st.req.env_id}.{kind} of task {st.req.task_id!r} (episode {st.episode.episode_id}) "
                           f"did not return within rollout.env_timeout_s={limit:g}; the episode ends as an "
                           "infrastructure error; the call is left running in its thread, and its env is closed if it returns")
            log.error("%s", err)
            fut.add_done_callback(lambda _f, st=st: self.worker._close(st))  # if the call ever returns
            self.worker._fail(st, TerminationReason.INFRA_ERROR, err)
            out.append(st)
        if out:
            self._swap_pool()
        return out

    @staticmethod
    def _abandon(st: Any) -> None:
        """Leave ``st``'s env (and, for a restart, the previous attempt's, which the same call
        closes first) to the running call: nothing else may close it beside that call."""
        st.abandoned = True
        if st.previous is not None:
            st.previous.abandoned = True

    def _swap_pool(self) -> None:
        """Fresh pools for every call not yet started: the old pools' threads may all be
        stuck, and what is queued behind them would never start (nor time out)."""
        old, self._pools = self._pools, self._new_pools()
        for pool in old.values():
            pool.shutdown(wait=False, cancel_futures=True)
        for fut in [f for f in self._futures if f.cancelled()]:
            kind, st = self._futures.pop(fut)
            fn = self._calls.pop(fut)
            new = self._pool_for(kind).submit(fn)
            self._futures[new] = (kind, st)
            self._calls[new] = fn

    def _wait_cap_s(self) -> float | None:
        """How long a wait may last before a running env call could overrun ``env_timeout_s``."""
        limit = self.worker.env_timeout_s
        if limit is None:
            return None
        now = time.monotonic()
        started = [st.env_call_started for kind, st in self._futures.values()
                   if kind not in _NOT_ENV_CALLS]  # read once: threads clear it
        left = [limit - (now - t) for t in started if t is not None]
        return max(0.01, min(left, default=limit) + 0.01)

    # ------------------------------------------------------------------ requests in
    def submit(self, requests: Sequence[EpisodeRequest]) -> None:
        """Start episodes for ``requests`` (their env resets go to the thread pool now).

        Raises:
            ContractError: an ``episode_id`` repeated in ``requests`` or already in flight.
        """
        ids = [r.episode_id for r in requests]
        dup = sorted({i for i in ids if ids.count(i) > 1} | (set(ids) & set(self._active)))
        if dup:
            raise ContractError(f"requests with episode_ids {dup[:5]} appear more than once in one rollout batch; "
                                "expected distinct (group_id, index, attempt) per request")
        for r in requests:
            self._group_expected[r.group_id] = self._group_expected.get(r.group_id, 0) + 1
            st = ActiveEpisode(req=r, episode=self._new_episode(r))
            self._active[r.episode_id] = st
            self._all.append(st)
            self._submit("reset", st, lambda st=st: self.worker._reset(st))

    def _new_episode(self, r: EpisodeRequest) -> Episode:
        return Episode(group_id=r.group_id, env_id=r.env_id, task_id=r.task_id, seed=r.seed,
                       prompt_mode=self.worker.limits.prompt_mode, episode_id=r.episode_id)

    def in_flight(self) -> int:
        """Episodes submitted and not finished."""
        return len(self._active)

    def idle(self) -> bool:
        """Nothing to do: no episode in flight, no env call or close pending, no load waiting."""
        return not self._active and not self._futures and self._load is None

    # ------------------------------------------------------------------ one step
    def step_once(self, wait_s: float | None = None) -> list[Episode]:
        """Harvest finished env calls, apply a pending weight load when its mode allows,
        run one engine step; return the episodes that finished (validated).

        Args:
            wait_s: with no engine work and no env call done, wait up to this many seconds
                for one (``None``: until one is done).

        Raises:
            RuntimeError: episodes in flight but nothing generating, stepping or held.
            ContractError: a finished episode breaks the data contract.
        """
        self._maybe_apply_load()
        finished, self._done_early = self._done_early, []
        finished.extend(self._expire_env_calls())
        ready = [f for f in self._futures if f.done()]
        if not ready and not self.engine.has_unfinished() and not self._queue and not finished:
            if not self._futures:
                if self._active and not self._held:
                    raise RuntimeError(f"rollout stalled: {len(self._active)} episodes neither generating nor stepping")
                return []
            cap = self._wait_cap_s()
            timeout = cap if wait_s is None else (wait_s if cap is None else min(wait_s, cap))
            ready = list(wait(list(self._futures), timeout=timeout, return_when=FIRST_COMPLETED)[0])
        judged = []
        for fut in ready:
            kind, st = self._futures.pop(fut)
            self._calls.pop(fut, None)
            if kind == "close":
                continue
            if kind in ("judge", "judge_group"):  # settled now: stamped with the submit time and this one
                settle = apply_judgement if kind == "judge" else apply_group_judgement
                sent = self._judge_sent.pop(fut, None)
                settle(st, fut, self.worker._fail, sent, success_threshold_of(self.worker.judge))
                judged.extend([st] if kind == "judge" else st)
                continue
            if st.episode.episode_id in self._restart_pending:
                self._restart(st)
                continue
            if self.worker._after_env(kind, fut, st, self._queue):
                finished.append(st)
        self._flush_queue()
        if self.engine.has_unfinished():
            for comp in self.engine.step():
                st = self._by_request.pop(comp.request_id)
                if self.worker._after_completion(comp, st):
                    finished.append(st)
                else:
                    self._submit("step", st, lambda st=st: self.worker._step(st))
        out = []
        judge = self.worker.judge
        for st in finished:
            if not st.abandoned:
                self._submit("close", st, lambda st=st: self.worker._close(st))
            if judge is not None and getattr(judge, "group_mode", False):
                self._group_finished(st, judge, judged)
                continue
            if judge is not None and self._judged(st):
                # judged as it ends; handed back when its reward is settled (its env and
                # sandbox are closed meanwhile)
                fut = judge.submit(st.episode, judge_item(st))
                self._futures[fut], self._judge_sent[fut] = ("judge", st), time.time()
                continue
            judged.append(st)
        for st in judged:
            self._active.pop(st.episode.episode_id, None)
            st.episode.validate()
            out.append(st.episode)
        return out

    def _group_finished(self, st: ActiveEpisode, judge: Any, out: list[ActiveEpisode]) -> None:
        """A group-mode judge: ``st`` waits for the rest of its group on this session (the
        requests of its ``group_id`` submitted here); the whole group goes to the judge in one
        call once every member has finished. An errored member is handed back at once (it is
        not judged) and counts as finished."""
        gid = st.episode.group_id
        done = self._group_done.setdefault(gid, [])
        done.append(st)
        if not self._judged(st):
            out.append(st)
        if len(done) < self._group_expected.get(gid, 1):
            return
        del self._group_done[gid]
        self._group_expected.pop(gid, None)
        # in request order (not finishing order): the same group is the same prompt, and cache key, again
        ok = sorted((m for m in done if self._judged(m)), key=lambda m: (m.req.index, m.req.attempt))
        if ok:
            fut = judge.submit_group([m.episode for m in ok], [judge_item(m) for m in ok])
            self._futures[fut], self._judge_sent[fut] = ("judge_group", ok), time.time()

    def _judged(self, st: ActiveEpisode) -> bool:
        """Whether ``st``'s finished episode goes to the judge: not an error, and not a cut
        answer that ``rollout.score_truncated: false`` already scored 0."""
        ep = st.episode
        cut = ep.termination_reason in (TerminationReason.LENGTH, TerminationReason.CONTEXT_LIMIT) \
            and ep.turns and ep.turns[-1].finish_reason == "length"
        return not ep.is_error and not (cut and not self.worker.limits.score_truncated)

    def _flush_queue(self) -> None:
        queue, self._queue = self._queue, []
        if self._load is not None and self._load.mode == "drain":
            self._held.extend(queue)
            return
        for st in queue:
            self._by_request[st.request_id] = st
            self.worker._add_turn(st, self.policy_version)

    # ------------------------------------------------------------------ weight loads
    def request_load(self, load: WeightLoad) -> None:
        """Apply ``load`` between engine steps (at the next ``step_once``; in ``drain``
        mode once the engine's in-flight generations have finished). ``load.stats`` is
        filled when it is applied.

        Raises:
            ContractError: another load is still pending.
        """
        if self._load is not None:
            raise ContractError("a weight load is already pending in this rollout session")
        self._load = load

    def load_pending(self) -> bool:
        return self._load is not None

    def _maybe_apply_load(self) -> WeightLoad | None:
        load = self._load
        if load is None:
            return None
        if load.mode == "drain" and self._by_request:
            return None
        drain_s = time.perf_counter() - load.requested_at if load.mode == "drain" else 0.0
        preempted: list[Completion] = []
        restarted = 0
        if load.mode == "continue" and self._by_request:
            preempted = self.engine.preempt(list(self._by_request))
        elif load.mode == "restart":
            restarted = self._abandon_for_restart()
        t0 = time.perf_counter()
        method = load.apply()  # loads and resets the prefix cache: an EngineError if anything still holds blocks
        apply_s = time.perf_counter() - t0
        if load.policy_version is not None:
            self.policy_version = int(load.policy_version)
        for comp in preempted:
            self._continue(comp)
        held, self._held = self._held, []
        for st in held:
            self._by_request[st.request_id] = st
            self.worker._add_turn(st, self.policy_version)
        load.stats.update({"method": method, "preempted_requests": len(preempted), "restarted_episodes": restarted,
                           "drain_s": drain_s, "apply_s": apply_s, "prefix_reset_ok": True,
                           "policy_version": self.policy_version})
        self._load = None
        return load

    def _continue(self, comp: Completion) -> None:
        """Re-add a preempted request as prompt + its partial ids under the new weights."""
        st = self._by_request.pop(comp.request_id)
        if comp.token_ids:
            st.segments.append((list(comp.token_ids), list(comp.log_probs), st.version))
        sampled = sum(len(seg[0]) for seg in st.segments)
        remaining = st.max_tokens - sampled
        if remaining < 1:  # every token of the budget was sampled: the turn ended by length
            self._finish_preempted(st)
            return
        turn = len(st.episode.turns)
        n_seg = len(st.segments)  # segments with tokens: a preemption before the first token keeps the seed
        st.preemptions += 1
        st.request_id = f"{st.episode.episode_id}:{turn}.{st.preemptions}"  # a fresh engine request id
        partial = [t for seg in st.segments for t in seg[0]]
        st.version = self.policy_version
        self._by_request[st.request_id] = st
        self.engine.add(st.request_id, st.engine_prompt + partial, sampling=self.worker.sampling, max_tokens=remaining,
                        stop_token_ids=self.worker.chat.stop_token_ids,
                        seed=segment_seed(st.req.sample_seed, turn, n_seg) if n_seg else st.seed,
                        **self.worker.stop_kwargs(partial, st.stop_strings))

    def _finish_preempted(self, st: Any) -> None:
        last = st.segments.pop()
        st.version = last[2]
        comp = Completion(st.request_id, tuple(last[0]), tuple(last[1]), "length", None)
        if self.worker._after_completion(comp, st):
            self._done_early.append(st)
        else:
            self._submit("step", st, lambda st=st: self.worker._step(st))

    def _abandon_for_restart(self) -> int:
        """``restart`` mode: abort every episode that has a turn in the engine or sampled
        tokens; each starts again from ``env.reset`` (now, or when its env call returns)."""
        if self._by_request:
            self.engine.abort(list(self._by_request))
        in_engine = list(self._by_request.values())
        self._by_request.clear()
        stepping = {st.episode.episode_id for kind, st in self._futures.values() if kind == "step"}
        n = 0
        for st in in_engine:
            self._restart(st)
            n += 1
        for eid in stepping:
            self._restart_pending.add(eid)
            n += 1
        self.restarted_episodes += n
        return n

    def _restart(self, st: Any) -> None:
        """Close ``st``'s env and sandbox and reset it from scratch, same episode id."""
        self._restart_pending.discard(st.episode.episode_id)
        fresh = ActiveEpisode(req=st.req, episode=self._new_episode(st.req))
        self._active[st.req.episode_id] = fresh
        self._all.append(fresh)

        def close_then_reset(old: Any = st, new: Any = fresh) -> Any:
            self.worker._close(old)
            return self.worker._reset(new)

        fresh.previous = st  # close_then_reset closes it: if that call is abandoned, so is st
        self._submit("reset", fresh, close_then_reset)

    # ------------------------------------------------------------------ the end
    def abort_all(self) -> list[EpisodeRequest]:
        """Abort every engine request, close every episode's env and sandbox, and return
        the requests whose episodes had not finished (in submission order)."""
        if self._by_request:
            try:
                self.engine.abort(list(self._by_request))
            except Exception:  # pragma: no cover - best effort
                log.exception("abort failed")
        unfinished = [st.req for st in self._active.values()]
        # env calls still running may be opening a sandbox (a reset): let them return first,
        # for up to env_timeout_s; one still running then is left to its thread (closed if it
        # returns), one not started is cancelled
        # (a judgement holds no env: the episodes waiting for one are among the unfinished)
        running = [f for f, (kind, _) in self._futures.items() if kind not in _NOT_ENV_CALLS]
        limit = self.worker.env_timeout_s
        for fut in wait(running, timeout=limit).not_done:
            if not fut.cancel():
                st = self._futures[fut][1]
                self._abandon(st)
                fut.add_done_callback(lambda _f, st=st: self.worker._close(st))
        for st in self._all:
            if not st.abandoned:  # its env is still in a stuck call's hands
                self.worker._close(st)
        self._active.clear()
        self._by_request.clear()
        self._queue.clear()
        self._held.clear()
        self._restart_pending.clear()
        self._group_expected.clear()
        self._group_done.clear()
        self._judge_sent.clear()
        self._futures = {f: v for f, v in self._futures.items() if v[0] == "close"}
        self._calls = {f: c for f, c in self._calls.items() if f in self._futures}
        return unfinished

    def wait_closed(self) -> None:
        """Wait for every pending env call and close."""
        wait(list(self._futures))
        self._futures.clear()
        self._calls.clear()

    def shutdown(self) -> None:
        """Stop the env thread pools (waits for running env calls)."""
        for pool in self._pools.values():
            pool.shutdown(wait=True)
