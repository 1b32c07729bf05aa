"""Registration of agentrl's environments with Gymnasium.

``register_envs()`` (called by ``import environments``) registers every id in
``ENV_ENTRY_POINTS`` once; re-importing is harmless. Make an environment with
``gymnasium.make(env_id, sandbox=...)``: the sandbox is injected, never created here.
"""

from __future__ import annotations

import gymnasium

__all__ = ["ENV_ENTRY_POINTS", "register_envs", "registered_env_ids"]

ENV_ENTRY_POINTS: dict[str, str] = {
    "agentrl/HumanEval-v0": "environments.humaneval:HumanEvalEnv",
}
"""Gymnasium id -> ``module:Class`` of each environment agentrl ships."""


def register_envs() -> list[str]:
    """Register every environment of ``ENV_ENTRY_POINTS`` not yet in Gymnasium's registry.

    Returns:
        The ids registered by this call (``[]`` when all were already registered).
    """
    added = []
    for env_id, entry_point in ENV_ENTRY_POINTS.items():
        if env_id in gymnasium.registry:
            continue
        # No TimeLimit wrapper (max_episode_steps): the env and the rollout bound episodes.
        gymnasium.register(id=env_id, entry_point=entry_point)
        added.append(env_id)
    return added


def registered_env_ids() -> list[str]:
    """agentrl's environment ids currently in Gymnasium's registry."""
    return [env_id for env_id in ENV_ENTRY_POINTS if env_id in gymnasium.registry]
