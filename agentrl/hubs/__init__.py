"""Hub adapters: environments from task hubs, registered as Gymnasium envs under ``hub/``.

Each hub's package is an optional extra of agentrl, imported only when one of its envs is
made or its tasks are listed; registering the ids imports none of them (the entry points are
strings). ``register()`` is agentrl's own ``agentrl.environments`` entry point
(``pyproject.toml``), so ``import environments`` registers every id below; importing this
package registers them too (for a checkout that is not installed: ``env.import_modules:
[agentrl.hubs]``). ``HUB_ENVS`` says where each id comes from and what it needs
(``HubEnv``), which ``agentrl envs list`` shows; docs/hubs/README.md is their index.

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

from dataclasses import dataclass

import gymnasium

__all__ = ["HUB_ENVS", "HUB_ENV_IDS", "HubEnv", "register"]


@dataclass(frozen=True)
class HubEnv:
    """One hub env: where it comes from and what it needs beyond agentrl's own packages
    (``agentrl envs list`` shows both, and whether the need is met here, docs/hubs/README.md).

    Attributes:
        env_id: the Gymnasium id, e.g. ``"hub/ReasoningGym-v0"``.
        entry_point: ``"module:Class"``, registered as a string (registering imports nothing).
        hub: the hub as its project spells it, e.g. ``"reasoning-gym"``.
        needs: what it needs, as the listing says it, e.g. ``"extra reasoning-gym"``.
        extra: the agentrl extra that installs the need (``pip install 'agentrl[<extra>]'``),
            or None.
        extra_module: the top-level module that extra installs (found with
            ``importlib.util.find_spec``, never imported), or None.
        docker: True when its tasks run in a Docker daemon's containers.
        hub_venv: the name prefix of the hub venvs ``scripts/hub_venvs.sh`` makes for it
            (``"verifiers-"``: ``verifiers-0.4.0``, ``verifiers-0.3.1``), or None.
        doc: its page, relative to the repository root.
        examples: its example configs, relative to the repository root.
    """

    env_id: str
    entry_point: str
    hub: str
    needs: str
    doc: str
    examples: tuple[str, ...]
    extra: str | None = None
    extra_module: str | None = None
    docker: bool = False
    hub_venv: str | None = None

    @property
    def source(self) -> str:
        """Where it comes from and what it needs, e.g. ``"hub: reasoning-gym (extra reasoning-gym)"``."""
        return f"hub: {self.hub} ({self.needs})"


HUB_ENVS: dict[str, HubEnv] = {e.env_id: e for e in (
    HubEnv("hub/ReasoningGym-v0", "agentrl.hubs.reasoning_gym:ReasoningGymEnv", "reasoning-gym",
           "extra reasoning-gym", "docs/hubs/reasoning-gym.md", ("examples/reasoning_gym_mix.yaml",),
           extra="reasoning-gym", extra_module="reasoning_gym"),
    HubEnv("hub/OpenEnv-v0", "agentrl.hubs.openenv:OpenEnvEnv", "OpenEnv", "extra openenv",
           "docs/hubs/openenv.md", ("examples/openenv_guess.yaml",), extra="openenv", extra_module="websockets"),
    HubEnv("hub/Verifiers-v0", "agentrl.hubs.verifiers_env:VerifiersEnv", "verifiers",
           "a hub venv, scripts/hub_venvs.sh", "docs/hubs/verifiers.md",
           ("examples/verifiers_classic.yaml", "examples/verifiers_v1.yaml"), hub_venv="verifiers-"),
    HubEnv("hub/Harbor-v0", "agentrl.hubs.harbor:HarborEnv", "Harbor", "Docker", "docs/hubs/harbor.md",
           ("examples/harbor_hello.yaml",), docker=True),
)}
"""Gymnasium id -> ``HubEnv`` of each hub env."""

HUB_ENV_IDS: dict[str, str] = {env_id: e.entry_point for env_id, e in HUB_ENVS.items()}
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
