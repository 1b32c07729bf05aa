"""Progress of ``agentrl tasks profile`` / ``agentrl eval`` while the episodes roll out, with the
real engine (tiny model, GuessNumber, no sandboxes): ``profile_tasks`` (which passes its
callbacks through ``evaluate``) reports its settings with the budget's source once, before
any episode, then ``(episodes finished, episodes requested)`` from ``(0, n)`` to ``(n, n)``,
never going back, fed by the engine's count of finished episodes
(``RolloutActor.rollout_progress``)."""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.slow

GUESS = "agentrl/GuessNumber-v0"


def test_profile_reports_its_budget_then_episodes_finished_of_the_total(ray_session, tmp_path, tiny_model_path):
    from agentrl.commands.profile import profile_tasks

    calls: list[tuple] = []
    threads: set[str] = set()

    def on_episodes(done: int, total: int) -> None:
        calls.append(("episodes", done, total))
        threads.add(threading.current_thread().name)

    res = profile_tasks(tiny_model_path, ["rollout.max_turns=2", "rollout.max_new_tokens=8",
                                          "rollout.max_context_tokens=512", "rollout.kv_cache_gb=1",
                                          f"run.output_dir={tmp_path}"],
                        env_id=GUESS, split="train", samples=3, num_tasks=2, out=tmp_path / "p.json",
                        replay_url=f"sqlite:///{tmp_path / 'r.db'}", on_settings=lambda s: calls.append(("settings", s)),
                        on_episodes=on_episodes)
    assert res.profile.samples == 3
    kinds = [c[0] for c in calls]
    assert kinds[0] == "settings" and kinds.count("settings") == 1
    settings = calls[0][1]
    assert settings["max_turns"] == 2 and settings["max_new_tokens"] == 8 and settings["tasks"] == 2
    assert settings["budget_source"].startswith("the rollout section of the packaged default config")
    assert "overridden: rollout.max_turns=2, rollout.max_new_tokens=8" in settings["budget_source"]
    episodes = [c[1:] for c in calls if c[0] == "episodes"]
    assert episodes[0] == (0, 6) and episodes[-1] == (6, 6)
    assert {t for _, t in episodes} == {6}
    assert [d for d, _ in episodes] == sorted(set(d for d, _ in episodes))  # grows, each count once
    assert "agentrl-rollout-progress" in threads or len(episodes) == 2  # polled while it ran (or all at once)
