"""Ray actors: one rollout actor (vLLM engine + agent loop + sandboxes) and N trainer ranks
(FSDP2 over gloo on CPU, NCCL on GPUs). The driver (``agentrl.cluster.controller``) wires
them. Weight sync: rank 0 gathers the full state dict, puts it in the object store and
returns the reference inside a list, so only the reference passes through the driver
(platform notes); the rollout actor loads it in place and resets vLLM's prefix cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Sequence

import ray

from agentrl.config import Config
from agentrl.errors import ClusterError, ConfigError
from agentrl.types import Episode, SamplingRecord

log = logging.getLogger(__name__)


def sampling_of(cfg: Config) -> SamplingRecord:
    return SamplingRecord(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k)


def stop_token_ids(model_path: str, tokenizer: Any) -> tuple[int, ...]:
    """Every EOS id the model declares (generation config first, then the tokenizer's);
    each counts as a stop (design.md, invariant 2; case C07)."""
    ids: list[int] = []
    gen = Path(model_path) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if isinstance(eos, int):
            ids.append(eos)
        elif isinstance(eos, list):
            ids.extend(int(x) for x in eos)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    if not ids:
        raise ConfigError(f"model {model_path!r} declares no EOS token id (generation_config.json or tokenizer)")
    return tuple(dict.fromkeys(ids))


def _close_env_ids(env_id: str) -> str:
    """``"; did you mean 'agentrl/HumanEval-v0'?"`` for an unregistered ``env_id`` (registered
    ids close to it by difflib, as Gymnasium suggests names), or ``""`` when none is close."""
    import difflib

    import gymnasium

    close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=3, cutoff=0.75)
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?" if close else ""


PROBE_TOOLS: tuple[dict, ...] = (
    {"type": "function", "function": {"name": "python", "description": "Run Python code.",
                                      "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                     "required": ["code"]}}},
)
"""The tools the start-up template check renders for an environment class that declares none."""


def check_chat_template(chat: Any, cfg: Config, env_cls: Any) -> bool:
    """The start-up template check (``rollout.check_template``): prove that turn-by-turn
    (delta) tokenization equals the full chat-template rendering, which ``full_history``
    relies on. ``per_step`` renders each step's whole prompt and never extends one turn by
    turn, so it needs no check and a template that cannot be extended is allowed there.

    The probe renders the environment class's own ``tools`` when the class declares them
    (a class attribute: a sequence of OpenAI-style tool schemas, empty for none), else
    ``PROBE_TOOLS`` (a python tool).

    Returns:
        True when the check ran (and passed), False when this run needs none.

    Raises:
        TemplateError: the template cannot be extended turn by turn (``full_history`` only).
    """
    if not cfg.rollout.check_template or cfg.rollout.prompt_mode != "full_history":
        return False
    declared = getattr(env_cls, "tools", None)
    tools = [dict(t) for t in declared] if isinstance(declared, (list, tuple)) else [dict(t) for t in PROBE_TOOLS]
    chat.check_incremental(tools=tools or None)
    return True


def env_task_ids(env_id: str, split: str, import_modules: Sequence[str] = ()) -> list[str]:
    """Task ids of a registered environment's split (its class's ``task_ids(split)``)."""
    import gymnasium

    import environments  # registers the built-ins and entry points

    environments.import_env_modules(list(import_modules))

    try:
        spec = gymnasium.spec(env_id)
    except Exception as exc:
        raise ConfigError(f"env.id={env_id!r} is not a registered environment ({exc}){_close_env_ids(env_id)}") from None
    from gymnasium.envs.registration import load_env_creator

    creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    fn = getattr(creator, "task_ids", None)
    if fn is None:
        raise ConfigError(f"environment {env_id!r} does not list its tasks (no task_ids(split) on {creator!r})")
    try:
        ids = list(fn(split))
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"env.split={split!r} is not a split of {env_id!r}: {exc}") from None
    return ids


def make_env_factory(cfg: Config, run_id: str, sandbox_hosts: Sequence[Any] | None = None, *, engine_index: int = 0):
    """The factory the rollout worker calls per episode: a fresh environment with its own
    sandbox (the worker closes both), or with none when the environment class says
    ``uses_sandbox = False`` (Sokoban and GuessNumber run in-process; TextWorld in a child process of its own).

    ``sandbox.backend`` is resolved once here (``sandboxes.choose_sandboxes`` with
    ``sandbox.docker_host``), logged as ``sandboxes: ...`` (the driver announced its own
    choice on the console: ``agentrl.cluster.sandbox_choice``), and used for every sandbox
    of the run, on the daemon chosen (``sandbox.docker_host``, ``DOCKER_HOST`` or the one
    agentrl's scripts started).

    With ``sandbox_hosts`` (the ``SandboxHostRef`` list of ``start_sandbox_hosts``, when
    ``cluster.sandbox_hosts > 0``) every sandbox is a ``RemoteSandbox`` on one of them
    (``agentrl.cluster.sandbox_host``): the backend was resolved on each host's node
    (``factory.backend``: their backends, comma-joined when they differ), no pool is kept
    here (the hosts keep it), and a ``HostBalancer`` starting at ``engine_index`` picks the
    host (``factory.balancer``).

    Raises:
        ConfigError: the env id is not registered in this process, or an unknown backend.
    """
    import gymnasium

    import environments
    from agentrl.cluster.sandbox_host import sandbox_spec
    from sandboxes import PooledSandbox, choose_sandboxes, make_sandbox

    environments.import_env_modules(cfg.env.import_modules)
    try:
        env_spec = gymnasium.spec(cfg.env.id)
    except Exception as exc:
        raise ConfigError(f"env.id={cfg.env.id!r} is not registered in the rollout process ({exc}){_close_env_ids(cfg.env.id)}; "
                          "list the module that registers it in env.import_modules") from None
    entry = env_spec.entry_point
    env_cls = gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    uses_sandbox = bool(getattr(env_cls, "uses_sandbox", True))

    spec = sandbox_spec(cfg, run_id)  # the same spec a sandbox host's pool holds
    docker_host = cfg.sandbox.docker_host
    backend = None
    hosts = list(sandbox_hosts or ())
    balancer = None
    if uses_sandbox and hosts:
        from agentrl.cluster.sandbox_host import HostBalancer, make_remote_sandbox

        balancer = HostBalancer(len(hosts), start=engine_index)
        backend = ",".join(dict.fromkeys(h.backend for h in hosts))
    elif uses_sandbox:
        choice = choose_sandboxes(cfg.sandbox.backend, spec.image, cfg.sandbox.docker_host)
        backend, docker_host = choice.backend, choice.docker_host
        log.info("sandboxes: %s", choice.why)

    pool = None
    if uses_sandbox and not hosts and cfg.sandbox.pool_size > 0:
        from sandboxes.pool import SandboxPool

        cap = cfg.sandbox.max_sandboxes or max(cfg.sandbox.pool_size, cfg.rollout.max_num_seqs)
        pool = SandboxPool(lambda: make_sandbox(backend, spec, docker_host=docker_host), size=cfg.sandbox.pool_size,
                           max_sandboxes=cap, between_episodes=cfg.sandbox.between_episodes)
        pool.wait_ready(timeout_s=300.0)  # warm before the first episode asks

    def factory(req):
        env_kwargs = factory.env_kwargs  # type: ignore[attr-defined]
        if not uses_sandbox:
            return gymnasium.make(req.env_id, disable_env_checker=True, **env_kwargs), None
        if balancer is not None:
            sandbox = make_remote_sandbox(hosts, balancer, spec)
        else:
            sandbox = (PooledSandbox(pool, pool.acquire()) if pool is not None
                       else make_sandbox(backend, spec, docker_host=docker_host))
        try:
            env = gymnasium.make(req.env_id, sandbox=sandbox, disable_env_checker=True, **env_kwargs)
        except BaseException:
            sandbox.close()
            raise
        return env, sandbox

    factory.pool = pool  # type: ignore[attr-defined]
    # the kwargs envs are made with: env.kwargs, or for one rollout call the eval judge's (RolloutActor.rollout)
    factory.env_kwargs = dict(cfg.env.kwargs)  # type: ignore[attr-defined]
    factory.backend = backend  # type: ignore[attr-defined]
    factory.balancer = balancer  # type: ignore[attr-defined]
    return factory


@contextlib.contextmanager
def budget_applied(worker: Any, budget: dict[str, Any] | None) -> Iterator[None]:
    """Within the block, ``worker`` (a ``RolloutWorker`` whose ``env_factory`` came from
    ``make_env_factory``) rolls out with ``budget`` (``agentrl.cluster.evaluate.eval_budget``):
    its ``temperature`` (top_p 1, top_k off), ``max_turns``, ``max_new_tokens``,
    ``max_context_tokens`` and, when given, ``env_kwargs`` (the eval judge's,
    ``agentrl.cluster.judge``: the kwargs the block's envs are made with). The run's
    settings are back afterwards, also when the block raises. ``None``: nothing changes."""
    if budget is None:
        yield
        return
    factory = worker.env_factory
    saved = (worker.limits, worker.sampling, factory.env_kwargs)
    try:
        worker.limits = dataclasses.replace(
            saved[0], max_turns=int(budget["max_turns"]), max_new_tokens=int(budget["max_new_tokens"]),
            max_context_tokens=int(budget["max_context_tokens"]))
        worker.sampling = SamplingRecord(temperature=float(budget["temperature"]), top_p=1.0, top_k=-1)
        if budget.get("env_kwargs") is not None:
            factory.env_kwargs = dict(budget["env_kwargs"])
        yield
    finally:
        worker.limits, worker.sampling, factory.env_kwargs = saved


@ray.remote(concurrency_groups={"stream": 4})
class RolloutActor:
    """Holds the vLLM engine and runs the agent loop with its sandboxes.

    Two ways to roll out: ``rollout(requests, v)`` (synchronous: runs a batch to the end) or
    a stream (asynchronous training, ``agentrl.rollout.stream``): ``stream_start``, then
    ``stream_submit`` / ``stream_collect`` at any time, weight loads between engine steps
    while episodes are in flight (``update_weights`` / ``receive_weights`` with
    ``policy_version`` and ``mode``), ``stream_stop``. The actor is threaded: the
    ``stream_*`` methods, ``rollout_progress`` and ``last_weight_load`` run in the
    concurrency group ``stream`` (4 threads), everything else in the default group (one
    thread, in call order), so a weight load and a waiting ``stream_collect`` run side by
    side. While a stream runs only its loop thread touches the engine: ``rollout``,
    ``sample`` and ``prompt_log_probs`` raise ``ClusterError`` then.

    ``engine_index``: this engine's place in the pool (``agentrl.cluster.engine_pool``),
    for logs and error messages only. Every engine starts with the same seed
    (``run.seed``); what an episode samples depends only on its request's ``sample_seed``
    (turn k is seeded ``sample_seed * 1009 + k``), so an episode does not depend on which
    engine ran it, nor on what else that engine batched with it, beyond floating-point
    numerics of the batched forward pass.

    ``sandbox_hosts``: with ``cluster.sandbox_hosts > 0``, the ``SandboxHostRef``s of
    ``start_sandbox_hosts``; its environments' sandboxes then run on them
    (``make_env_factory``), else in this process.
    """

    def __init__(self, cfg_dict: dict, model_path: str, run_id: str, engine_index: int = 0,
                 sandbox_hosts: Sequence[Any] | None = None) -> None:
        from transformers import AutoTokenizer

        from agentrl.rollout.chat import ChatTokenizer
        from agentrl.rollout.engine import VLLMEngine
        from agentrl.rollout.loop import RolloutLimits, RolloutWorker

        cfg = Config.model_validate(cfg_dict)
        self.cfg = cfg
        self.engine_index = engine_index
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        chat = ChatTokenizer(tokenizer, stop_token_ids(model_path, tokenizer))
        if cfg.rollout.check_template and cfg.rollout.prompt_mode == "full_history":
            import environments

            environments.import_env_modules(cfg.env.import_modules)
            check_chat_template(chat, cfg, environments.env_class(cfg.env.id))
        t0 = time.perf_counter()
        self.engine = VLLMEngine(model_path, dtype=cfg.model.dtype, max_model_len=cfg.rollout.max_context_tokens,
                                 seed=cfg.run.seed, kv_cache_gb=cfg.rollout.kv_cache_gb, max_num_seqs=cfg.rollout.max_num_seqs,
                                 decode=tokenizer.decode)
        self.engine_start_s = time.perf_counter() - t0
        self.worker = RolloutWorker(
            self.engine, chat, make_env_factory(cfg, run_id, sandbox_hosts, engine_index=engine_index),
            RolloutLimits(cfg.rollout.max_turns, cfg.rollout.max_new_tokens, cfg.rollout.max_context_tokens,
                          score_truncated=cfg.rollout.score_truncated, prompt_mode=cfg.rollout.prompt_mode,
                          history_length=cfg.rollout.history_length, stop_strings=tuple(cfg.rollout.stop_strings)),
            sampling_of(cfg), env_workers=cfg.rollout.env_workers, env_timeout_s=cfg.rollout.env_timeout_s,
        )
        from agentrl.rollout.stream import StreamRunner

        self.stream = StreamRunner(self.worker, policy_version=0)
        self._load_extra: dict = {}

    def ready(self) -> float:
        return self.engine_start_s

    def node(self) -> dict:
        """Where this engine runs: ``{"engine_index": int, "node_id": hex str, "node_ip": str,
        "pid": int}`` (named in the error of the episodes it loses)."""
        ctx = ray.get_runtime_context()
        return {"engine_index": self.engine_index, "node_id": ctx.get_node_id(),
                "node_ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def pool_stats(self) -> dict | None:
        """Warm-pool statistics (start-up and acquire latencies), or None without a pool."""
        from dataclasses import asdict

        pool = getattr(self.worker.env_factory, "pool", None)
        return None if pool is None else asdict(pool.stats())

    def rollout(self, requests: Sequence[Any], policy_version: int,
                budget: dict[str, Any] | None = None) -> tuple[list[Episode], float]:
        """Run ``requests`` to the end. ``budget`` (``agentrl.cluster.evaluate.eval_budget``:
        ``temperature``, ``max_turns``, ``max_new_tokens``, ``max_context_tokens``) replaces the
        run's sampling (top_p 1, top_k off) and limits for this call only, and its optional
        ``env_kwargs`` (the eval judge's, ``agentrl.cluster.judge``) the kwargs this call's envs
        are made with; None: the run's."""
        self._not_streaming("rollout")
        t0 = time.perf_counter()
        first = requests[0] if requests else None
        self._rollout_progress = [0, len(requests), f"{first.run_id}/{first.iteration}" if first is not None else ""]

        def finished(_episode: Episode) -> None:
            self._rollout_progress[0] += 1

        with budget_applied(self.worker, budget):
            episodes = self.worker.run(requests, policy_version, on_episode=finished)
        return episodes, time.perf_counter() - t0

    @ray.method(concurrency_group="stream")
    def rollout_progress(self) -> tuple[int, int, str]:
        """``(finished, requested, "run_id/iteration" of its first request)`` episodes of the
        ``rollout`` call running now (or the last one; ``(0, 0, "")`` before any): answered
        while it runs (another concurrency group), for progress bars
        (``agentrl.cluster.rollout_progress``)."""
        done, total, key = getattr(self, "_rollout_progress", (0, 0, ""))
        return int(done), int(total), str(key)

    def _not_streaming(self, what: str) -> None:
        if self.stream.running:
            raise ClusterError(f"engine {self.engine_index}: {what}() while the rollout stream runs; "
                               "stream_stop() first (the stream's thread owns the engine)")

    # -- streaming (agentrl.rollout.stream; asynchronous training) --
    def set_policy_version(self, version: int) -> None:
        """The engine's weight version (resume: the checkpoint's); only while no stream runs.

        Raises:
            ConfigError: ``version`` < 0. ClusterError: a stream runs.
        """
        self.stream.set_policy_version(version)

    @ray.method(concurrency_group="stream")
    def stream_start(self) -> None:
        """Start the stream's loop thread (idempotent). Episodes start under the engine's
        current version: the last load's, ``set_policy_version``'s, or 0."""
        self.stream.start()

    @ray.method(concurrency_group="stream")
    def stream_submit(self, requests: Sequence[Any]) -> None:
        """Enqueue ``EpisodeRequest``s (non-blocking). Raises ClusterError without a stream."""
        self.stream.submit(requests)

    @ray.method(concurrency_group="stream")
    def stream_collect(self, wait_s: float) -> list[Episode]:
        """Episodes finished since the last call, waiting up to ``wait_s`` seconds for at
        least one (``[]`` on timeout); raises the loop thread's error if it died."""
        return self.stream.collect(wait_s)

    @ray.method(concurrency_group="stream")
    def stream_in_flight(self) -> int:
        """Episodes submitted and not yet collected."""
        return self.stream.in_flight()

    @ray.method(concurrency_group="stream")
    def stream_stop(self) -> list[Any]:
        """Stop the loop thread, abort everything in flight, close the sandboxes; returns
        the ``EpisodeRequest``s whose episodes had not finished. Finished, uncollected
        episodes stay collectable."""
        return self.stream.stop()

    # -- weight sync (agentrl.cluster.weight_sync) --
    def _weight_receiver(self) -> Any:
        if getattr(self, "_weights_in", None) is None:
            from agentrl.cluster.weight_sync import WeightReceiver

            self._weights_in = WeightReceiver()
        return self._weights_in

    def _load_target(self, policy_version: int | None, mode: str) -> Any:
        """The engine (no stream: load now, nothing is in flight) or a proxy that hands the
        load to the stream's loop thread (applied between engine steps per ``mode``)."""
        from agentrl.rollout.session import LOAD_MODES
        from agentrl.rollout.stream import _LoadProxy

        if mode not in LOAD_MODES:
            raise ConfigError(f"weight load mode={mode!r} is not one of {list(LOAD_MODES)} (controller.partial_rollout)")
        if policy_version is not None and int(policy_version) < 0:
            raise ConfigError(f"policy_version={policy_version} must be >= 0")
        if self.stream.running:
            return _LoadProxy(self.stream, policy_version, mode)
        return self.engine

    def _loaded(self, target: Any, policy_version: int | None) -> None:
        stats = getattr(target, "stats", None)
        if stats is None:  # loaded directly: nothing was in flight
            if policy_version is not None:
                self.stream.set_policy_version(policy_version)
            stats = {"preempted_requests": 0, "restarted_episodes": 0, "drain_s": 0.0, "prefix_reset_ok": True,
                     "policy_version": self.stream.policy_version}
        self._load_extra = {k: stats[k] for k in ("preempted_requests", "restarted_episodes", "drain_s",
                                                   "prefix_reset_ok", "policy_version")}

    def update_weights(self, payload: list, policy_version: int | None = None, mode: str = "continue") -> float:
        """Load the weights ``TrainerActor.state_dict_ref`` put in the object store
        (``payload``: its ``[ref, stats]``); seconds taken (get, load, prefix-cache reset).
        While a stream runs, the get happens here and the load in the loop thread between
        engine steps, per ``mode`` (``continue`` | ``drain`` | ``restart``,
        ``agentrl.rollout.session``); returns when the new weights are live.
        ``policy_version``: the engine's version from then on (``None`` keeps it).

        Raises:
            ConfigError: an unknown ``mode``. EngineError: the prefix cache could not be reset.
        """
        target = self._load_target(policy_version, mode)
        seconds = self._weight_receiver().load_from_store(target, payload[0])
        self._loaded(target, policy_version)
        return seconds

    def join_weight_group(self, spec: Any, rank: int) -> None:
        """Join the collective path's weight-sync group ``spec`` (a ``GroupSpec``) as ``rank``."""
        self._weight_receiver().join(spec, rank)

    def receive_weights(self, key: str, layout: Any, policy_version: int | None = None, mode: str = "continue") -> float:
        """Receive group ``key``'s broadcast (a ``FlatLayout`` buffer) and load it; seconds
        taken. With a stream running: received here, loaded as ``update_weights`` says."""
        target = self._load_target(policy_version, mode)
        seconds = self._weight_receiver().receive(target, key, layout)
        self._loaded(target, policy_version)
        return seconds

    @ray.method(concurrency_group="stream")
    def last_weight_load(self) -> dict:
        """The last weight load: seconds per phase, ``method`` (``in_place`` |
        ``reload_weights``), ``preempted_requests``, ``restarted_episodes``, ``drain_s``
        (seconds waiting for in-flight generations, ``drain`` mode), ``prefix_reset_ok``
        and the engine's ``policy_version`` after it."""
        return {**self._weight_receiver().last, **self._load_extra}

    def prompt_log_probs(self, token_ids: list[int]) -> list[float]:
        self._not_streaming("prompt_log_probs")
        return self.engine.prompt_log_probs(token_ids)

    def sample(self, prompt_ids: list[int], temperature: float, max_tokens: int, seed: int) -> tuple[list[int], list[float]]:
        """Sample one completion of ``prompt_ids`` (for evaluation and checks): ``(ids,
        behavior_log_probs)`` at ``temperature``."""
        self._not_streaming("sample")
        rid = f"sample-{uuid.uuid4().hex}"
        self.engine.add(rid, prompt_ids, sampling=SamplingRecord(temperature=temperature), max_tokens=max_tokens,
                        stop_token_ids=self.worker.chat.stop_token_ids, seed=seed)
        while self.engine.has_unfinished():
            for comp in self.engine.step():
                if comp.request_id == rid:
                    return list(comp.token_ids), list(comp.log_probs)
        raise RuntimeError(f"request {rid} vanished from the engine")


def _interface_of(ip: str) -> str | None:
    """The name of the network interface that holds the IPv4 address ``ip`` (e.g.
    ``"eth0"``), or None when ``ip`` is loopback or IPv6, or no interface holds it (or the
    platform cannot say: the lookup is Linux's ``SIOCGIFADDR``). Gloo binds its
    connections to it (``GLOO_SOCKET_IFNAME``), so a host whose name resolves to
    127.0.1.1 still meets ranks on other nodes."""
    import fcntl
    import ipaddress
    import struct

    addr = ipaddress.ip_address(ip)
    if addr.is_loopback or addr.version != 4:
        return None
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # an interface without an IPv4 address
            if socket.inet_ntoa(raw[20:24]) == ip:
                return name
    return None


@ray.remote
class TrainerActor:
    """One FSDP2 rank of the policy trainer (and of the critic, when the run trains one).

    Started in phases, so that ranks on different nodes meet at rank 0's node
    (``agentrl.cluster.trainer_group.TrainerGroup`` drives them):

    1. ``__init__``: keeps its arguments; no rendezvous, no model.
    2. ``endpoint()`` (rank 0): this node's IP and a TCP port bound there, held until ``setup``.
    3. ``setup(master_addr, master_port, timeout_s)`` (every rank): joins the process group
       at rank 0's endpoint within ``timeout_s`` seconds or raises ``ClusterError``.
    4. ``build()`` (every rank, collective): the ``PolicyTrainer`` / ``CriticTrainer``.
    """

    def __init__(self, rank: int, world_size: int, cfg_dict: dict, model_path: str) -> None:
        if not 0 <= rank < world_size:
            raise ConfigError(f"trainer rank={rank} is not in [0, world_size={world_size})")
        import torch.distributed  # noqa: F401  (imported here, so setup's clock measures the meeting only)

        self.cfg = Config.model_validate(cfg_dict)
        self.rank = rank
        self.world_size = world_size
        self.model_path = model_path
        self.trainer: Any = None
        self.critic: Any = None
        self._listen_sock: socket.socket | None = None  # rank 0: the port reserved by endpoint()
        self._store: Any = None  # the TCPStore of the group (kept alive with it)

    def node(self) -> dict:
        """Where this rank runs: ``{"rank": int, "node_id": hex str, "node_ip": str, "pid": int}``."""
        ctx = ray.get_runtime_context()
        return {"rank": self.rank, "node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}

    def endpoint(self) -> tuple[str, int]:
        """Rank 0's meeting point: ``(node_ip, port)``, a TCP port bound on this node's IP
        (Ray's node address) and listening, so nothing else can take it before ``setup``
        hands the socket to the process group's TCP store. Calling it again returns the
        same endpoint.

        Raises:
            ClusterError: called on a rank other than 0.
        """
        if self.rank != 0:
            raise ClusterError(f"endpoint() is rank 0's; this is rank {self.rank}")
        if self._listen_sock is None:
            ip = ray.util.get_node_ip_address()
            sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((ip, 0))
            sock.listen(128)  # ranks that dial before setup wait in the backlog instead of being refused
            self._listen_sock = sock
        host, port = self._listen_sock.getsockname()[:2]
        return str(host), int(port)

    def setup(self, master_addr: str, master_port: int, timeout_s: float) -> dict:
        """Join the trainer process group at rank 0's ``(master_addr, master_port)``.

        Sets ``MASTER_ADDR`` / ``MASTER_PORT`` / ``RANK`` / ``WORLD_SIZE``; rank 0 serves the
        TCP store on the socket ``endpoint()`` reserved and waits for every other rank to
        connect, the others connect to it; then ``init_process_group(trainer.backend,
        timeout=timeout_s)`` (gloo pinned to the interface of this node's IP unless
        ``GLOO_SOCKET_IFNAME`` is set) and one all-reduce as the first collective. Every
        wait of the meeting (store connect, waiting for the ranks, the backend's
        connection mesh, the first collective) is bounded by ``timeout_s``. Afterwards the
        group's collective timeout goes back to torch's default (30 min for gloo,
        10 min for NCCL), so a long checkpoint write on rank 0 does not trip it.

        Returns:
            ``node()`` of this rank.

        Raises:
            ClusterError: the ranks did not meet within ``timeout_s`` (names this rank and
                node, the endpoint and the timeout), or ``endpoint()`` was not called on rank 0.
        """
        from datetime import timedelta

        import torch
        import torch.distributed as dist
        from torch.distributed.constants import default_pg_timeout

        backend = self.cfg.trainer.backend
        os.environ.update({"MASTER_ADDR": str(master_addr), "MASTER_PORT": str(master_port),
                           "RANK": str(self.rank), "WORLD_SIZE": str(self.world_size)})
        node_ip = ray.util.get_node_ip_address()
        if backend == "gloo" and not os.environ.get("GLOO_SOCKET_IFNAME"):
            ifname = _interface_of(node_ip)
            if ifname is not None:  # else gloo resolves the hostname (loopback on some hosts)
                os.environ["GLOO_SOCKET_IFNAME"] = ifname
        timeout = timedelta(seconds=float(timeout_s))
        t0 = time.monotonic()
        try:
            if self.rank == 0:
                if self._listen_sock is None:
                    raise ClusterError("trainer rank 0: setup() before endpoint(); the group asks rank 0 for its endpoint first")
                fd = self._listen_sock.detach()  # the store's server owns (and closes) the socket from here
                self._listen_sock = None
                store = dist.TCPStore(master_addr, int(master_port), self.world_size, is_master=True, timeout=timeout,
                                      wait_for_workers=True, master_listen_fd=fd)
            else:
                store = dist.TCPStore(master_addr, int(master_port), self.world_size, is_master=False, timeout=timeout)
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size, timeout=timeout)
            device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
            probe = torch.ones(1, device=device)
            dist.all_reduce(probe)
            if int(probe.item()) != self.world_size:
                raise ClusterError(f"trainer rank {self.rank}: the first all-reduce summed {probe.item()} "
                                   f"over world_size={self.world_size} ranks")
        except ClusterError:
            raise
        except (RuntimeError, OSError) as exc:  # torch's DistError / DistStoreError / DistNetworkError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            who = (f"trainer rank 0 serving the meeting at {master_addr}:{master_port} (node {node_ip}): the other ranks "
                   "did not all arrive" if self.rank == 0 else
                   f"trainer rank {self.rank} (node {node_ip}) could not meet rank 0 at {master_addr}:{master_port}")
            raise ClusterError(
                f"{who} within cluster.rendezvous_timeout_s={float(timeout_s):g} s (after {time.monotonic() - t0:.1f} s): "
                f"{type(exc).__name__}: {first}"
            ) from None
        dist.distributed_c10d._set_pg_timeout(default_pg_timeout)
        store.set_timeout(default_pg_timeout)
        self._store = store
        return self.node()

    def build(self) -> None:
        """Build this rank's trainers from the run config (the model loads and FSDP2 shards
        it over the group ``setup`` joined). Collective: every rank calls it.

        Raises:
            ClusterError: ``setup`` has not completed on this rank.
            ConfigError: from ``trainer_configs`` (e.g. a reference model with another vocabulary).
        """
        import torch.distributed as dist

        from agentrl.config import trainer_configs
        from agentrl.trainer import CriticTrainer, PolicyTrainer

        if not dist.is_initialized():
            raise ClusterError(f"trainer rank {self.rank}: build() before setup() joined the process group")
        policy_cfg, critic_cfg = trainer_configs(self.cfg, self.model_path)  # critic_cfg: None without a critic
        self.trainer = PolicyTrainer(policy_cfg)
        self.critic = CriticTrainer(critic_cfg) if critic_cfg is not None else None

    def step(self, batch) -> dict[str, float]:
        return self.trainer.step(batch)

    def last_token_values(self) -> Any:
        """``PolicyTrainer.last_token_values``: the last step's per-token trainer log-probs
        and entropies (``[T]`` float32 each), or ``None``. Local to the rank."""
        return self.trainer.last_token_values()

    def compute_log_probs(self, batch) -> Any:
        return self.trainer.compute_log_probs(batch)

    def kl_to_reference(self, batch) -> tuple[Any, dict[str, float]]:
        """``PolicyTrainer.kl_to_reference`` (all ranks must call): per-token KL estimates
        of the sampled tokens to the reference, and the ``kl/*`` metrics."""
        return self.trainer.kl_to_reference(batch)

    # -- weight sync (agentrl.cluster.weight_sync) --
    def _weight_sender(self) -> Any:
        if getattr(self, "_weights_out", None) is None:
            from agentrl.cluster.weight_sync import WeightSender

            self._weights_out = WeightSender()
        return self._weights_out

    def state_dict_ref(self) -> list | None:
        """The weights for the engines, packed into one buffer in Ray's object store. All
        ranks must call (the gather is collective); rank 0 returns ``[ref, stats]`` (a
        list, so the driver passes the reference on unresolved; ``stats``: ``gather_s``,
        ``pack_s``, ``put_s``, ``mb``), the others ``None``."""
        out = self._weight_sender().gather(self.trainer, self.rank, self.cfg.model.dtype)
        if out is None:
            return None
        layout, stats = out
        ref, put_s = self._weight_sender().put()
        return [ref, {**stats, "put_s": put_s, "mb": layout.nbytes / 1e6}]

    def warm_weight_sync(self) -> float:
        """All ranks, once before the first sync: pre-touch the sync's buffers
        (``WeightSender.warm``); seconds taken."""
        return self._weight_sender().warm(self.trainer, self.rank, self.cfg.model.dtype, self.cfg.cluster.weight_sync)

    def gather_weights(self) -> tuple | None:
        """The collective path's gather (all ranks): rank 0 returns ``(layout, stats,
        key of the weight-sync group it holds or None)``, the others ``None``."""
        out = self._weight_sender().gather(self.trainer, self.rank, self.cfg.model.dtype)
        return None if out is None else (*out, self._weight_sender().group_key())

    def weight_group_endpoint(self) -> tuple[str, int, str]:
        """Rank 0: ``(node_ip, port, backend)`` for a new weight-sync group."""
        return self._weight_sender().endpoint()

    def join_weight_group(self, spec: Any) -> None:
        """Rank 0: host and join the weight-sync group ``spec`` as its rank 0."""
        self._weight_sender().join(spec)

    def broadcast_weights(self, key: str) -> float:
        """Rank 0: broadcast the gathered weights to group ``key``; seconds taken."""
        return self._weight_sender().broadcast(key)

    def critic_values(self, batch) -> Any:
        return self.critic.compute_values(batch)

    def critic_step(self, batch) -> dict[str, float]:
        return self.critic.step(batch)

    def save_checkpoint(self, path: str) -> None:
        self.trainer.save_checkpoint(path)
        if self.critic is not None:
            self.critic.save_checkpoint(path + "_critic")

    def load_checkpoint(self, path: str) -> None:
        self.trainer.load_checkpoint(path)
        if self.critic is not None:
            self.critic.load_checkpoint(path + "_critic")

    def save_hf(self, path: str) -> None:
        self.trainer.save_hf(path)
