"""The viewer tests' database contents, written through the store's normal write path.

Contents (``VIEW``): run ``run-a`` (2 iterations of 8 episodes: tasks ``task-0`` / ``task-1``,
two groups of 4 per iteration, metrics per iteration, iteration 0 marked complete), run
``run-b`` (1 iteration on the same tasks, other actions), an episode whose model output,
observation, anchor, sandbox command and output carry an XSS payload, an errored episode
(no reward), and a long episode (3,000 tokens: three token pages).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from agentrl.replay import ReplayStore
from agentrl.types import Episode, ExecResult, SamplingRecord, TerminationReason, Turn

XSS = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">" onmouseover="alert(1)'
ATTR_XSS = '" onmouseover="window.__pwned=3" x="'
LONG_TOKENS = 3000


@dataclass(frozen=True)
class View:
    """The ids the tests look for."""

    xss_episode: str = "ep-xss"
    long_episode: str = "ep-long"
    error_episode: str = "ep-error"
    xss_task: str = "task-xss" + ATTR_XSS


VIEW = View()


def _turn(k: int, n_prompt: int, n_completion: int, *, seed: int, action: str, obs: str, reward: float | None,
          anchor: object, events: list[ExecResult] | None = None, version: int = 0) -> Turn:
    return Turn(prompt_ids=[(seed * 7 + j) % 500 for j in range(n_prompt)],
                completion_ids=[(seed * 11 + j) % 500 + 500 for j in range(n_completion)],
                behavior_log_probs=[-0.05 * ((j + seed) % 9) for j in range(n_completion)],
                sampling=SamplingRecord(temperature=1.0), policy_version=version, finish_reason="stop",
                reward=reward, anchor=anchor, action_text=action, observation_text=obs,
                exec_results=events or [])


def episode(eid: str, task: str, group: str, reward: float, *, variant: str = "", success: bool | None = None,
            turns: int = 2, version: int = 0) -> Episode:
    """A ``turns``-turn episode: turn 0 acts from the shared anchor ``"start"`` (every rollout of
    a group shares it: one GiGPO step group), later turns from per-episode anchors."""
    ts = []
    for k in range(turns):
        ev = [ExecResult(command=("bash", "-lc", f"ls {variant}{k}"), exit_code=k % 2, stdout=f"file{k}\n",
                         stderr="warn\n" if k else "", duration_s=0.25 * (k + 1), timed_out=(k == 1),
                         truncated_bytes=1234 if k == 1 else 0)]
        ts.append(_turn(k, 6 + k, 4 + k, seed=zlib.crc32(f"{eid}{k}".encode()) % 97, action=f"<bash>ls {variant}{k}</bash>",
                        obs=f"file{k} of {task}", reward=reward if k == turns - 1 else 0.0,
                        anchor="start" if k == 0 else (eid, k), events=ev, version=version))
    return Episode(group_id=group, env_id="agentrl/Test-v0", task_id=task, seed=1, turns=ts, terminated=True,
                   termination_reason=TerminationReason.ENV_TERMINATED, episode_id=eid,
                   success=success if success is not None else reward > 0.5)


RERUN_REPORT = {"outcome": "different", "first_divergent_turn": 1, "error": None, "turns": [
    {"turn_index": 0, "same": True, "status": "same", "fields": []},
    {"turn_index": 1, "same": False, "status": "different", "fields": [
        {"field": "observation", "recorded": "file1", "rerun": "file1 " + XSS,
         "diff": "--- recorded\n+++ rerun\n-file1\n+file1 " + XSS}]}]}


def trainer_values(turn: Turn) -> tuple[list[float], list[float]]:
    """Trainer-side log-probs (behavior's + 0.01 · position: gap 0.01 · j) and entropies (0.5 + j)."""
    n = len(turn.completion_ids)
    return ([lp + 0.01 * j for j, lp in enumerate(turn.behavior_log_probs)], [0.5 + j for j in range(n)])


def fill(store: ReplayStore) -> None:
    cfg = {"env": {"id": "agentrl/Test-v0"}, "model": {"path": "no-such-model"}, "controller": {"mode": "sync"}}
    store.start_run("run-a", cfg)
    for it in range(2):
        eps = [episode(f"a{it}-{g}-{i}", f"task-{g}", f"a{it}-g{g}", reward=float((i + g + it) % 3) / 2,
                       variant="a", version=it) for g in range(2) for i in range(4)]
        extra: list[Episode] = []
        if it == 1:
            x = episode(VIEW.xss_episode, VIEW.xss_task, "g-xss", 1.0)
            x.turns[0].action_text = XSS
            x.turns[0].observation_text = XSS
            x.turns[0].anchor = XSS
            x.turns[0].exec_results = [ExecResult(command=XSS, exit_code=0, stdout=XSS, stderr=XSS, duration_s=0.1)]
            err = episode(VIEW.error_episode, "task-0", "g-err", 0.0)
            err.termination_reason = TerminationReason.INFRA_ERROR
            err.error = {"type": "InfraError", "message": "sandbox died"}
            err.turns[-1].reward = None
            long = Episode(group_id="g-long", env_id="agentrl/Test-v0", task_id="task-long", seed=2,
                           turns=[_turn(k, 500, 500, seed=k, action=f"step {k}", obs=f"obs {k}", reward=0.0,
                                        anchor=f"s{k}", version=1)
                                  for k in range(LONG_TOKENS // 1000)],
                           terminated=True, termination_reason=TerminationReason.MAX_TURNS, episode_id=VIEW.long_episode)
            extra = [x, err, long]
        adv = {e.episode_id: [0.5 - 0.25 * k for k in range(len(e.turns))] for e in eps}
        store.add_episodes("run-a", it, eps + extra, adv)
        if it == 0:  # what the update stores for the turns it trained on (turn 1 of a0-0-0: not trained)
            store.set_trainer_values("run-a", {"a0-0-0": [trainer_values(eps[0].turns[0]), None]})
        store.add_metrics("run-a", it, {
            "rollout/reward_mean": 0.25 + 0.25 * it, "rollout/success_rate": 0.5 * it,
            "tokens/generated": 1000.0 + it, "tokens/trained": 800.0, "tokens/discarded": 200.0 + it,
            "time/rollout_s": 3.0, "time/credit_s": 0.1, "time/update_s": 2.0, "time/sync_s": 0.5,
            "time/iteration_s": 6.0, "rollout_corr/gap_abs_mean": 1e-3 * (it + 1)})
    store.mark_complete("run-a", 0)  # iteration 0 (its rows) complete, 1 in progress
    store.add_rerun("a0-0-1", same=False, first_divergent_turn=1, report=RERUN_REPORT)
    store.start_run("run-b", cfg)
    store.add_episodes("run-b", 0, [episode(f"b0-{g}-{i}", f"task-{g}", f"b0-g{g}", reward=1.0, variant="b")
                                    for g in range(2) for i in range(4)])
    store.add_metrics("run-b", 0, {"rollout/reward_mean": 1.0})


