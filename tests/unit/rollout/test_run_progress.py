"""``RolloutWorker.run``'s ``on_episode``: called once per episode, as each finishes (where
``RolloutActor.rollout_progress`` counts them for ``agentrl eval``'s progress bar), not all at
the end. The scripted engine and tokenizer of ``test_session``; a real worker and session."""

from __future__ import annotations

import gymnasium as gym

from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import EpisodeRequest, SamplingRecord
from tests.unit.rollout.test_session import STOP, CharTokenizer, ScriptedEngine


class StepsEnv(gym.Env):
    """Ends after as many steps as its task id says ("1", "3")."""

    def reset(self, *, seed=None, options=None):
        self.left = int(options["task_id"])
        return "go", {}

    def step(self, action):
        self.left -= 1
        return "obs", 1.0, self.left == 0, False, {}


def test_on_episode_is_called_as_each_episode_finishes():
    engine = ScriptedEngine(answer_len=3)
    worker = RolloutWorker(engine, ChatTokenizer(CharTokenizer(), (STOP,)), lambda req: (StepsEnv(), None),
                           RolloutLimits(max_turns=4, max_new_tokens=8, max_context_tokens=4096), SamplingRecord(),
                           env_workers=2)
    requests = [EpisodeRequest("x/E-v0", t, 0, f"g-{i}", sample_seed=10 + i) for i, t in enumerate(["3", "1", "3"])]
    seen: list[tuple[str, int]] = []
    episodes = worker.run(requests, 0, on_episode=lambda ep: seen.append((ep.task_id, engine.steps)))
    assert [e.episode_id for e in episodes] == [r.episode_id for r in requests]  # request order, as before
    assert sorted(t for t, _ in seen) == ["1", "3", "3"]  # once per episode
    assert seen[0][0] == "1"  # the one-turn episode is reported first ...
    assert seen[0][1] < seen[-1][1]  # ... while the engine still had the others' turns to step
    assert worker.run(requests[:1], 0)[0].task_id == "3"  # on_episode is optional
