"""Deterministic multi-turn episodes for the replay tests (the ``make_episode`` fixture of
``conftest.py``, and ``data/make_schema5_db.py``, which made the schema-5 fixture file with
the store of that time: the same ``build_episode(i)`` must keep giving the same episode)."""

from __future__ import annotations

from agentrl.types import Episode, ExecResult, SamplingRecord, TerminationReason, Turn


def build_episode(i: int, num_turns: int = 3, events_per_turn: int = 2, group_size: int = 4,
                  **fields: object) -> Episode:
    """A valid, deterministic episode number ``i`` whose turns run sandbox commands;
    ``fields`` override ``Episode`` fields."""
    turns = []
    for k in range(num_turns):
        n_prompt, n_completion = 40 + 7 * k, 24 + 5 * k
        base = 1000 * i + 100 * k
        turns.append(Turn(
            prompt_ids=[(base + j) % 49152 for j in range(n_prompt)],
            completion_ids=[(base + 3 * j + 1) % 49152 for j in range(n_completion)],
            behavior_log_probs=[-(((i + 1) * (k + 1) * (j + 1)) % 97) / 13.0 for j in range(n_completion)],
            sampling=SamplingRecord(temperature=0.7, top_p=1.0, top_k=-1),
            policy_version=i % 3 + k // 2,
            finish_reason="stop",
            reward=float(k == num_turns - 1) * (i % 2),
            anchor=f"state {i}-{k}",
            action_text=f"<bash>echo {i} {k}</bash>",
            observation_text=f"{i} {k}\n",
            exec_results=[
                ExecResult(command=("bash", "-lc", f"echo {i} {k} {e}"), exit_code=0,
                           stdout=f"{i} {k} {e}\n", stderr="", duration_s=0.01 * (e + 1))
                for e in range(events_per_turn)
            ],
        ))
    defaults: dict[str, object] = dict(
        group_id=f"group-{i // group_size}", env_id="agentrl/Bash-v0", task_id=f"task-{i // group_size}",
        seed=i // group_size, turns=turns, terminated=True, truncated=False,
        termination_reason=TerminationReason.ENV_TERMINATED,
    )
    defaults.update(fields)
    return Episode(**defaults)  # type: ignore[arg-type]
