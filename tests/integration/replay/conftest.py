"""Fixtures for the replay store tests: a real database (SQLite file, or PostgreSQL when
``AGENTRL_TEST_POSTGRES_URL`` is set) and a factory of realistic multi-turn episodes."""

from __future__ import annotations

import os
from typing import Callable, Iterator

import pytest
from sqlalchemy import create_engine

from agentrl.replay import ReplayStore
from agentrl.replay.models import Base
from agentrl.types import Episode, ExecResult, SamplingRecord, TerminationReason, Turn

POSTGRES_ENV = "AGENTRL_TEST_POSTGRES_URL"


def _drop_all(url: str) -> None:
    engine = create_engine(url)
    try:
        Base.metadata.drop_all(engine)
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A URL to an empty replay database: a SQLite file under ``tmp_path``, or the
    PostgreSQL database named by ``$AGENTRL_TEST_POSTGRES_URL`` (its replay tables are
    dropped before and after the test; do not point it at a database you care about)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'replay.db'}"
        return
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(
            f"no PostgreSQL server: set {POSTGRES_ENV}, e.g. "
            "postgresql+psycopg://postgres@/agentrl_test?host=/run/postgresql"
        )
    try:
        _drop_all(url)
    except Exception as exc:  # server down, bad credentials, missing driver
        pytest.skip(f"PostgreSQL at ${POSTGRES_ENV} is not reachable: {exc}")
    yield url
    _drop_all(url)


@pytest.fixture
def store(db_url: str) -> Iterator[ReplayStore]:
    s = ReplayStore(db_url)
    try:
        yield s
    finally:
        s.close()


MakeEpisode = Callable[..., Episode]


@pytest.fixture
def make_episode() -> MakeEpisode:
    """``make_episode(i, num_turns=3, events_per_turn=2, group_size=4, **episode_fields)``:
    a valid, deterministic multi-turn episode whose turns run sandbox commands."""

    def make(i: int, num_turns: int = 3, events_per_turn: int = 2, group_size: int = 4,
             **fields: object) -> Episode:
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

    return make
