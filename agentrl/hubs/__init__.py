"""Hub adapters: environments from task hubs, registered as Gymnasium envs under ``hub/``.

Each hub's package is an optional extra of agentrl, imported only when one of its envs is
made or its tasks are listed; registering the ids imports none of them (the entry points are
strings). ``register()`` is agentrl's own ``agentrl.environments`` entry point
(``pyproject.toml``), so ``import environments`` registers every id below; importing this
package registers them too (for a checkout that is not installed: ``env.import_modules:
[agentrl.hubs]``).

Envs:

``hub/ReasoningGym-v0`` (``agentrl.hubs.reasoning_gym``, extra ``reasoning-gym``): any
reasoning-gym family or a weighted mix of them, single-turn or with feedback over several
attempts (docs/hubs/reasoning-gym.md).

``hub/OpenEnv-v0`` (``agentrl.hubs.openenv``, extra ``openenv``): an OpenEnv server (an
address, a local process or a Docker image) driven over its ``/ws`` protocol; the openenv
package itself is never imported (docs/hubs/openenv.md).

``hub/Harbor-v0`` (``agentrl.hubs.harbor``, no extra: Docker): Harbor task folders
(``task.toml``, ``instruction.md``, ``environment/Dockerfile``, ``tests/test.sh``,
``solution/solve.sh``), each run in a container of its own image built by the Docker sandbox
backend, with a bash tool or an agent command on the gateway; ``harbor`` is never imported
(docs/hubs/harbor.md).

``hub/Verifiers-v0`` (``agentrl.hubs.verifiers_env``): a verifiers environment (classic API
0.3.x or a v1 taskset 0.4.x) run by a hub venv's python through the gateway; verifiers is
never imported here (docs/hubs/verifiers.md).
"""

from __future__ import annotations

import gymnasium

__all__ = ["HUB_ENV_IDS", "register"]

HUB_ENV_IDS: dict[str, str] = {
    "hub/ReasoningGym-v0": "agentrl.hubs.reasoning_gym:ReasoningGymEnv",  # needs `reasoning-gym`
    "hub/OpenEnv-v0": "agentrl.hubs.openenv:OpenEnvEnv",  # needs `websockets` (extra openenv)
    "hub/Verifiers-v0": "agentrl.hubs.verifiers_env:VerifiersEnv",  # verifiers in a hub venv (`python`)
    "hub/Harbor-v0": "agentrl.hubs.harbor:HarborEnv",  # needs a Docker daemon (no extra)
}
"""Gymnasium id -> ``module:Class`` of each hub env."""


def register() -> list[str]:
    """Register every id of ``HUB_ENV_IDS`` not yet in Gymnasium's registry (no hub package
    is imported: the entry points are strings).

    Returns:
        The ids registered by this call (``[]`` when all were registered already).
    """
    added = []
    for env_id, entry_point in HUB_ENV_IDS.items():
        if env_id not in gymnasium.registry:
            # No TimeLimit wrapper (max_episode_steps): the env and the rollout bound episodes.
            gymnasium.register(id=env_id, entry_point=entry_point)
            added.append(env_id)
    return added


register()
