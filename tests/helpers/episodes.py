"""Hand-made episodes for the credit and critics tests: token ids counting up from 100, so
every position is easy to read in a failure."""

from __future__ import annotations

from agentrl.types import Episode, Turn


def make_episode(mode: str, completions=(2, 3), prompts=(3, 2), rewards=(0.5, 1.0), episode_id="ep") -> Episode:
    """An episode in ``mode`` (``full_history`` / ``per_step``) with turn k's prompt of
    ``prompts[k]`` tokens, completion of ``completions[k]`` tokens (log-prob -0.1 each) and
    reward ``rewards[k]``."""
    turns, tok = [], 100
    for p, c, r in zip(prompts, completions, rewards):
        turns.append(Turn(prompt_ids=list(range(tok, tok + p)), completion_ids=list(range(tok + p, tok + p + c)),
                          behavior_log_probs=[-0.1] * c, reward=r))
        tok += p + c
    return Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=turns, prompt_mode=mode, episode_id=episode_id)
