"""The ``cluster`` section: where the run's Ray actors go (``RolePlacement`` per role),
which Ray instance it joins, and how engines, sandbox hosts and weight syncs are laid out."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from agentrl.config.base import Section


class RolePlacement(Section):
    """What Ray reserves for one actor of a role (one trainer rank, one rollout engine, one
    sandbox host): the ``.options(num_cpus=, num_gpus=, resources=)`` of that actor."""

    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs Ray reserves per actor of this role.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs Ray reserves per actor of this role (fractions share a GPU).")
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources per actor, e.g. {'rollout': 1} to place this role only on nodes "
                    "started with `ray start --resources '{\"rollout\": 4}'`. Names non-empty, amounts >= 0.",
    )

    @field_validator("resources")
    @classmethod
    def _resource_names(cls, resources: dict[str, float]) -> dict[str, float]:
        for name, amount in resources.items():
            if not name.strip():
                raise ValueError(f"a resource name must be non-empty, got {resources!r}")
            if amount < 0:
                raise ValueError(f"the amount of {name!r} must be >= 0, got {resources!r}")
        return resources


class SandboxPlacement(RolePlacement):
    """``RolePlacement`` of a sandbox host: half a CPU unless set, also when only its
    ``resources`` are given (a host mostly waits on its sandboxes' processes)."""

    num_cpus: float = Field(0.5, ge=0, description="Logical CPUs Ray reserves per sandbox host.")


class PlacementConfig(Section):
    """Per-role Ray reservations; ``agentrl.cluster.actors.placement.role_options`` turns an entry
    into actor options and ``check_placement`` checks them against the cluster at start-up."""

    trainer: RolePlacement = Field(
        default_factory=lambda: RolePlacement(num_cpus=1.0),
        description="One trainer rank (trainer.num_ranks of them).",
    )
    rollout: RolePlacement = Field(
        default_factory=lambda: RolePlacement(num_cpus=1.0),
        description="One rollout engine: a vLLM engine, its agent loop and (with cluster.sandbox_hosts=0) its sandboxes.",
    )
    sandbox: SandboxPlacement = Field(
        default_factory=SandboxPlacement,
        description="One sandbox host (cluster.sandbox_hosts of them).",
    )
    eval: RolePlacement = Field(
        default_factory=lambda: RolePlacement(num_cpus=1.0),
        description="The dedicated eval engine of asynchronous training (eval.engine dedicated, "
                    "agentrl.driver.dedicated_eval): a vLLM engine and its sandboxes that evaluate one policy version "
                    "at a time while training goes on.",
    )
    judge: RolePlacement = Field(
        default_factory=lambda: RolePlacement(num_cpus=1.0),
        description="One engine of the local judge pool (reward.judge.kind: pool, reward.judge.num_engines of them, "
                    "agentrl.cluster.actors.judge_pool): a vLLM engine of the judge model, never trained.",
    )


class ClusterConfig(Section):
    address: str | None = Field(
        None,
        description="None: always start a new local Ray instance (ray.init(address='local')), whatever "
                    "RAY_ADDRESS or an earlier `ray start` says. 'auto' (RAY_ADDRESS, else the cluster the last "
                    "`ray start` on this machine recorded), 'host:port' or 'ray://host:port': join that running "
                    "cluster (cluster.num_cpus is then ignored). Inside a `ray job submit` job pass "
                    "cluster.address=auto.",
    )
    num_cpus: int | None = Field(None, ge=1, description="Logical CPUs for a local Ray instance (None: detected).")
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig,
        description="What Ray reserves per actor of each role (trainer rank, rollout engine, sandbox host); "
                    "checked against the cluster's nodes at start-up.",
    )
    node_wait_s: float = Field(
        0.0, ge=0,
        description="After a rollout engine is lost (its node removed, its actor killed): 0 regenerates its "
                    "in-flight episodes on the remaining engines at once; > 0 first starts a replacement engine "
                    "(same placement) and waits up to this many seconds for it, saying so in the log. With no "
                    "engine left and none back in time the run stops with a ClusterError (the last checkpoint "
                    "stays intact).",
    )
    rendezvous_timeout_s: float = Field(
        120.0, gt=0,
        description="Seconds the trainer ranks have to meet at rank 0's node (the process group's TCP store "
                    "and its first collective); a rank that does not arrive in time stops the run with a "
                    "ClusterError naming rank 0's node address and port instead of a silent hang.",
    )
    weight_sync: Literal["object_store", "collective"] = Field(
        "object_store",
        description="How new weights reach every engine after an update (agentrl.cluster.engines.weight_sync). "
                    "'object_store': trainer rank 0 puts one flat buffer in Ray's object store and every engine "
                    "reads it (zero-copy on its node) in parallel; the fast choice on CPU. 'collective': rank 0 "
                    "broadcasts the buffer over a process group of its own with the engines (NCCL where the "
                    "trainer has a GPU, gloo on CPU), formed within cluster.rendezvous_timeout_s.",
    )
    sandbox_hosts: int = Field(
        0, ge=0,
        description="0: every rollout actor runs its sandboxes in its own process, on its own node. N > 0: N "
                    "SandboxHost actors, placed with cluster.placement.sandbox, hold every sandbox (the backend "
                    "is resolved on each host's node) and the rollout actors reach them through Ray; each "
                    "rollout actor sends a new sandbox to the host where it has the fewest open, ties in turn. "
                    "A lost host makes its episodes infra_error, never a reward, and takes no new sandboxes.",
    )

    @field_validator("address")
    @classmethod
    def _address(cls, address: str | None) -> str | None:
        """``"local"`` (Ray's word for a new local instance) is the unset address, so it gets
        ``cluster.num_cpus`` and ignores ``RAY_ADDRESS`` like None; an empty one is an error."""
        if address is None:
            return None
        if not address.strip():
            raise ValueError(f"got {address!r}; expected 'auto', 'host:port' or 'ray://host:port', "
                             "or leave it unset (null) to start a local Ray instance")
        return None if address.strip() == "local" else address.strip()
