"""The trainer ranks of a run as one object: ``TrainerGroup``.

The ``trainer.num_ranks`` ``TrainerActor`` ranks are placed with the trainer role's Ray
options (``cluster.placement.trainer``), so on a cluster they may land on different nodes.
They meet at rank 0's node, never at the driver's: rank 0 reports its node's IP and a port
bound there, every rank joins the process group at that endpoint within
``cluster.rendezvous_timeout_s``, and a meeting that cannot complete (a rank that never
arrives, a port no one can reach) is a ``ClusterError`` naming the node, the port, the ranks
that did not finish and the timeout, never a silent hang.

Every trainer method is collective (FSDP2): the group calls it on every rank with the same
arguments (put in the object store once) and returns rank 0's result. A rank whose actor
died (its node was removed, Ray's memory monitor killed it) is a ``ClusterError`` naming the
rank and its node; an error raised inside a rank reaches the caller as that error.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agentrl.cluster.actors.actor_errors import actor_failure_message
from agentrl.cluster.actors.error_text import raised_error
from agentrl.config import Config
from agentrl.errors import ClusterError

log = logging.getLogger(__name__)

__all__ = ["TrainerGroup"]

_ERROR_GRACE_S = 2.0
"""After one rank fails, how long to look for a rank that died: the death is the cause, the
survivors' errors (a peer that closed its connection) only follow from it."""


def rendezvous_deadline_s(timeout_s: float) -> float:
    """How long the driver waits for every rank's ``setup``: ``timeout_s`` (each rank's own
    bound) plus a margin for the calls to reach the ranks, ``5 s + 10 %``."""
    return timeout_s + 5.0 + 0.1 * timeout_s


START_S = 60.0
"""Time a rank has to start beyond ``rendezvous_timeout_s`` (Ray's worker start and the torch
import: tens of seconds on a loaded 2-core machine), before it counts as not placed."""


def _resources(res: dict[str, float]) -> dict[str, float]:
    """Ray's resource totals as a user reads them: no per-node ``node:*`` markers, memory in GiB."""
    out = {}
    for k, v in sorted(res.items()):
        if k.startswith("node:"):
            continue
        out[f"{k}_gib" if "memory" in k else k] = round(v / 2**30, 1) if "memory" in k else v
    return out


def _first_line(exc: BaseException) -> str:
    """The first line of what went wrong: the error a rank raised (not Ray's task header), or
    Ray's one-line account of a dead actor (for a rank whose constructor raised, the error it
    raised: ``actor_failure_message``)."""
    from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError  # heavy: ray

    if isinstance(exc, (RayActorError, OutOfMemoryError)):  # a memory-monitor kill names what it used
        return actor_failure_message(exc)
    if isinstance(exc, RayTaskError) and getattr(exc, "cause", None) is not None:
        exc = exc.cause
    text = str(exc).strip()
    if type(exc).__name__ == "ValidationError":  # pydantic's header line says nothing: its errors do
        return raised_error(f"ValidationError: {text}") or text.splitlines()[0]
    return text.splitlines()[0] if text else type(exc).__name__


class TrainerGroup:
    """The ``trainer.num_ranks`` FSDP2 ranks of the policy (and critic) trainer.

    The constructor places every rank, has them meet at rank 0's endpoint and starts
    building the trainers (model load and sharding), without waiting for the build: the
    first method call (or ``ready()``) waits for it, so the rollout engines can start
    meanwhile.

    Args:
        cfg: the validated run config (``trainer.num_ranks``, ``cluster.rendezvous_timeout_s``).
        cfg_dict: ``cfg.model_dump(mode="json")``, what every rank validates again.
        model_path: the prepared policy model folder.
        options: ``TrainerActor.options(...)`` kwargs for one rank (``num_cpus``, ``num_gpus``,
            ``resources``), e.g. ``role_options(cfg, "trainer")``.

    Start-up, in order: every rank is created (rank 0 first) and must be running within
    ``rendezvous_timeout_s + START_S``; rank 0 reports its endpoint (``TrainerActor.endpoint``:
    its node's IP and a port it holds there); every rank's ``setup`` meets there, each bounded
    by ``rendezvous_timeout_s`` in its own process, the whole by ``rendezvous_deadline_s`` in
    the driver; then the ranks ``build`` their trainers.

    Attributes:
        world_size: number of ranks (``trainer.num_ranks``).
        timeout_s: ``cluster.rendezvous_timeout_s``.
        options: the per-rank ``.options()`` kwargs.
        master_addr, master_port: rank 0's endpoint (node IP, TCP port) where the ranks met.
        nodes: ``TrainerActor.node()`` of each rank, rank 0 first (``rank``, ``node_id``,
            ``node_ip``, ``pid``).

    Raises:
        ClusterError: a rank was not placed on any node (or did not start) in time, or the
            ranks did not meet within the bound (rank 0's node IP, the port, the ranks that
            did not finish, the timeout). The ranks are killed before it is raised.
    """

    def __init__(self, cfg: Config, cfg_dict: dict, model_path: str, options: dict[str, Any]) -> None:
        import ray  # heavy: ray

        from agentrl.cluster.actors.trainer_actor import TrainerActor  # heavy: ray (the actor class is a ray.remote)

        self.world_size = int(cfg.trainer.num_ranks)
        self.timeout_s = float(cfg.cluster.rendezvous_timeout_s)
        self.options = dict(options)
        self.master_addr = ""
        self.master_port = 0
        self.nodes: list[dict] = []
        self._actors: list[Any] = []
        self._building: list[Any] | None = None
        try:
            self._actors.append(TrainerActor.options(**self.options).remote(0, self.world_size, cfg_dict, model_path))
            self._actors += [TrainerActor.options(**self.options).remote(r, self.world_size, cfg_dict, model_path)
                             for r in range(1, self.world_size)]
            self.nodes = self._placed()
            self.master_addr, self.master_port = ray.get(self._actors[0].endpoint.remote())
            self._meet()
            log.info("trainer ranks met at %s:%d (%s)", self.master_addr, self.master_port,
                     ", ".join(f"rank {n['rank']} on {n['node_ip']}" for n in self.nodes))
            self._building = [a.build.remote() for a in self._actors]
        except BaseException:
            self.kill()
            raise

    @property
    def actors(self) -> list[Any]:
        """The rank actors (``TrainerActor`` handles), rank 0 first."""
        return list(self._actors)

    # ----------------------------------------------------------------- start-up

    def _placed(self) -> list[dict]:
        """``node()`` of every rank once its actor runs, waited for at most ``timeout_s +
        START_S`` (placement, then the worker's start with its torch import, which is slow
        on a loaded machine and is not part of the meeting)."""
        import ray  # heavy: ray

        refs = {r: a.node.remote() for r, a in enumerate(self._actors)}
        done, failed, pending = self._wait(refs, time.monotonic() + self.timeout_s + START_S)
        if failed:
            rank, exc = failed[0]
            raise ClusterError(f"trainer rank {rank} did not start: {_first_line(exc)}") from None
        if pending:
            raise ClusterError(
                f"trainer rank(s) {pending} were not placed on any node (or did not start) within "
                f"cluster.rendezvous_timeout_s={self.timeout_s:g} s + {START_S:g} s to start: each rank asks for "
                f"{self.options}; the cluster has {_resources(ray.cluster_resources())} in all, "
                f"{_resources(ray.available_resources())} free"
            )
        return [done[r] for r in range(self.world_size)]

    def _meet(self) -> None:
        """Every rank's ``setup`` at rank 0's endpoint, within ``rendezvous_deadline_s``."""
        refs = {r: a.setup.remote(self.master_addr, self.master_port, self.timeout_s) for r, a in enumerate(self._actors)}
        t0 = time.monotonic()
        _, failed, pending = self._wait(refs, t0 + rendezvous_deadline_s(self.timeout_s))
        if not failed and not pending:
            return
        unfinished = sorted({r for r, _ in failed} | set(pending))
        where = ", ".join(f"rank {r} on {self.nodes[r]['node_ip']}" for r in unfinished)
        head = (f"trainer ranks did not meet at rank 0's node {self.master_addr} port {self.master_port} within "
                f"cluster.rendezvous_timeout_s={self.timeout_s:g} s (waited {time.monotonic() - t0:.1f} s): "
                f"rank(s) {unfinished} did not finish ({where})")
        if failed:
            rank, exc = failed[0]
            raise ClusterError(f"{head}; rank {rank}: {_first_line(exc)}") from None
        raise ClusterError(head)

    @staticmethod
    def _wait(refs: dict[int, Any], deadline: float
              ) -> tuple[dict[int, Any], list[tuple[int, BaseException]], list[int]]:
        """Wait for ``refs`` (rank -> object ref) until all are done, one failed, or
        ``deadline`` (``time.monotonic()``; ``inf``: no deadline). Returns ``(results by
        rank, [(rank, error)], ranks still pending)``."""
        import ray  # heavy: ray

        rank_of = {ref: r for r, ref in refs.items()}
        pending = list(refs.values())
        done: dict[int, Any] = {}
        failed: list[tuple[int, BaseException]] = []
        while pending and not failed:
            left = None if deadline == float("inf") else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in ready:
                try:
                    done[rank_of[ref]] = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - reported with its rank
                    failed.append((rank_of[ref], exc))
        return done, failed, sorted(rank_of[ref] for ref in pending)

    # ----------------------------------------------------------------- calls

    def ready(self) -> None:
        """Wait until every rank has built its trainers.

        Raises:
            ClusterError: a rank died while building.
            Exception: a rank's build raised (``ConfigError`` ...), as raised there.
        """
        if self._building is not None:
            self._gather(self._building, "build")  # a failed build raises again at every later call
            self._building = None

    def _call(self, method: str, *args: Any) -> Any:
        """Call ``method(*args)`` on every rank (non-scalar arguments put in the object store
        once) and return rank 0's result."""
        import ray  # heavy: ray

        self.ready()
        put = [a if isinstance(a, (str, int, float, bool, type(None))) else ray.put(a) for a in args]
        return self._gather([getattr(actor, method).remote(*put) for actor in self._actors], method)[0]

    def _gather(self, refs: list, method: str) -> list:
        """Every rank's result of ``method``, rank 0 first. The first failure is raised as it
        arrives (a rank blocked in a collective with a failed peer may not return for a
        long time); a rank's death is preferred over the errors it causes in the others."""
        from ray.exceptions import RayActorError  # heavy: ray

        done, failed, pending = self._wait(dict(enumerate(refs)), float("inf"))
        if not failed:
            return [done[r] for r in range(len(refs))]
        if pending and not isinstance(failed[0][1], RayActorError):
            _, more, _ = self._wait({r: refs[r] for r in pending}, time.monotonic() + _ERROR_GRACE_S)
            failed += more
        dead = [(r, exc) for r, exc in failed if isinstance(exc, RayActorError)]
        if dead:
            rank, exc = dead[0]
            raise ClusterError(self._death_message(rank, method, exc)) from None
        raise failed[0][1]

    def _death_message(self, rank: int, method: str, exc: BaseException) -> str:
        node = self.nodes[rank] if rank < len(self.nodes) else {}
        detail = actor_failure_message(exc, f"trainer rank {rank}")
        if " on node " not in detail and node:  # Ray's message did not say where: the group knows
            detail += f" (rank {rank} ran on node {node['node_ip']}, node id {node['node_id']})"
        return (f"{detail} (during {method}); the run stops: the last checkpoint is intact and "
                "resuming the run continues from it")

    def train_step(self, batch: Any) -> Any:
        """``PolicyTrainer.step`` on every rank: one update on a ``TokenBatch``. Returns rank
        0's ``agentrl.trainer.trainer.StepResult``: ``metrics`` (``actor/*``, already reduced
        over the ranks), ``log_probs`` and ``entropies`` (``[T]`` float32 CPU tensors of
        every rank's rows of this batch, at the weights the update started from; 0 where
        ``loss_mask`` is 0). The other ranks return metrics only."""
        return self._call("step", batch)

    def critic_step(self, batch: Any) -> dict[str, float]:
        """``CriticTrainer.step`` on every rank (a ``ValueBatch``); rank 0's metrics."""
        return self._call("critic_step", batch)

    def critic_values(self, batch: Any) -> Any:
        """``CriticTrainer.compute_values`` on every rank: rank 0's values of the
        ``ValueBatch``, ``[N]`` float32 on CPU, one per ``batch.positions`` entry."""
        return self._call("critic_values", batch)

    def kl_to_reference(self, batch: Any) -> tuple[Any, dict[str, float]]:
        """``PolicyTrainer.kl_to_reference`` on every rank: rank 0's per-token KL estimates
        of the ``TokenBatch``'s sampled tokens to the reference (float32 tensor) and the
        ``kl/*`` metrics."""
        return self._call("kl_to_reference", batch)

    def compute_log_probs(self, batch: Any) -> Any:
        """``PolicyTrainer.compute_log_probs`` on every rank: rank 0's log-probs (nats,
        float32 ``[T]``) of the ``TokenBatch``'s tokens under the current weights."""
        return self._call("compute_log_probs", batch)

    def state_dict_ref(self) -> list:
        """The full policy state dict in the object store, gathered from every rank:
        rank 0's ``[ref]`` (a list, so the driver passes the reference on unresolved)."""
        return self._call("state_dict_ref")

    def save_checkpoint(self, path: str) -> None:
        """Every rank writes its part of the trainers' checkpoint under ``path`` (the
        critic's, when there is one, under ``path + "_critic"``)."""
        self._call("save_checkpoint", str(path))

    def load_checkpoint(self, path: str) -> None:
        """Every rank loads the trainers' checkpoint that ``save_checkpoint(path)`` wrote."""
        self._call("load_checkpoint", str(path))

    def kill(self) -> None:
        """Kill every rank (idempotent; errors of already-dead actors are ignored)."""
        import ray  # heavy: ray

        for actor in self._actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        self._building = None
