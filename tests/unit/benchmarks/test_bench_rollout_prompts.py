"""The rollout benchmark's raw-vLLM replay (``tests/benchmarks/bench_rollout.py``): every
engine call of an episode is rebuilt as the loop sent it (full_history: the whole stream so
far plus the turn's new ids; per_step: the turn's ids alone) with the length it sampled, and
prompts are split over engines in contiguous, near-equal parts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from agentrl.types import Episode, Turn

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_rollout.py"
_spec = importlib.util.spec_from_file_location("bench_rollout", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _episode(mode):
    turns = [Turn(prompt_ids=[1, 2, 3], completion_ids=[10, 11], behavior_log_probs=[-1.0, -1.0]),
             Turn(prompt_ids=[4, 5], completion_ids=[12, 13, 14], behavior_log_probs=[-1.0] * 3)]
    return Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=turns, prompt_mode=mode, episode_id="x")


def test_full_history_prompts_are_the_stream_so_far():
    ep = _episode("full_history")
    prompts, lengths, turns = bench.engine_prompts([ep])
    assert prompts == [[1, 2, 3], [1, 2, 3, 10, 11, 4, 5]]
    assert lengths == [2, 3] and turns == [0, 1]
    assert prompts[1] == ep.token_ids()[: len(prompts[1])]


def test_per_step_prompts_are_the_turns_own():
    prompts, lengths, turns = bench.engine_prompts([_episode("per_step")])
    assert prompts == [[1, 2, 3], [4, 5]] and lengths == [2, 3]


def test_split_is_contiguous_and_even():
    parts = bench._split(17, 2)
    assert parts == [slice(0, 9), slice(9, 17)]
    assert bench._split(3, 1) == [slice(0, 3)]
