"""One gateway address for a run's engines: the ``GatewayRouter`` (``agentrl.gateway.router``)
in front of every rollout engine's gateway, started by the engine pool when the run's
environment is an agent behind the gateway (its class says ``serves_gateway``).

Each engine's gateway is added as a backend (``RolloutActor.gateway_backend``), and each
engine is told the router's address (``RolloutActor.set_gateway_router``), so an agent whose
harness takes one base URL for the whole run (and names its session in the ``X-Session-ID``
header) gets it as ``task.shared_base_url``. A replacement engine joins the same way; a lost
one's sessions ended with its episodes.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import ray

import environments
from agentrl.config import Config
from agentrl.gateway.router import GatewayRouter

log = logging.getLogger(__name__)


def serves_gateway(cfg: Config) -> bool:
    """Whether the run's environment is an agent behind the gateway."""
    environments.import_env_modules(list(cfg.env.import_modules))
    return bool(getattr(environments.env_class(cfg.env.id), "serves_gateway", False))


class EngineGatewayRouter:
    """The router of one engine pool (module docstring).

    Args:
        actors: the engines' ``RolloutActor`` handles.
        host: the address the router listens on (``AGENTRL_GATEWAY_HOST``, default
            ``127.0.0.1``: the engines and the agents on this machine).
    """

    def __init__(self, actors: Sequence[Any], host: str | None = None) -> None:
        self.router = GatewayRouter(host=host or os.environ.get("AGENTRL_GATEWAY_HOST", "127.0.0.1"))
        self.add(actors)
        log.info("gateway: %s/v1 routes the sessions of %d engines (X-Session-ID), or %s/sessions/<id>/v1",
                 self.router.base_url, len(actors), self.router.base_url)

    @property
    def base_url(self) -> str:
        return self.router.base_url

    def add(self, actors: Sequence[Any]) -> None:
        """Route to the gateways of ``actors`` and tell them the router's address."""
        for backend in ray.get([a.gateway_backend.remote() for a in actors]):
            self.router.add_backend(**backend)
        ray.get([a.set_gateway_router.remote(f"{self.router.base_url}/v1") for a in actors])

    def shutdown(self) -> None:
        self.router.shutdown()
