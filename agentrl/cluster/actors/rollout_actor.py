"""The rollout's Ray actor: ``RolloutActor`` holds one vLLM engine and runs the agent loop
(``agentrl.rollout``) with its environments (``agentrl.cluster.actors.env_factory``) and
sandboxes; the engine pool (``agentrl.cluster.engines.pool``) drives N of them. Weight sync:
the actor loads the weights a trainer rank put in the object store in place and resets
vLLM's prefix cache (``agentrl.cluster.engines.weight_sync``). Beside it, the chat helpers it
starts with: the run's sampling (``sampling_of``), the model's stop ids (``stop_token_ids``)
and the start-up template check (``check_chat_template``).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import ray

import environments
from agentrl.cluster.actors.env_factory import EnvFactory
from agentrl.cluster.actors.judge_service import rollout_scorer
from agentrl.config import Config
from agentrl.errors import ClusterError, ConfigError
from agentrl.gateway.server import gateway, set_router_url
from agentrl.rollout.budget import RolloutBudget
from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.engine import VLLMEngine
from agentrl.rollout.loop import RolloutWorker
from agentrl.rollout.session import LOAD_MODES
from agentrl.rollout.state import RolloutLimits
from agentrl.rollout.stream import LoadProxy, StreamRunner
from agentrl.types import Episode, SamplingRecord

log = logging.getLogger(__name__)


def sampling_of(cfg: Config) -> SamplingRecord:
    return SamplingRecord(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k)


def stop_token_ids(model_path: str, tokenizer: Any) -> tuple[int, ...]:
    """Every EOS id the model declares (generation config first, then the tokenizer's);
    each counts as a stop (docs/design.md, invariant 2; docs/cases.md, C07)."""
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

    ``engine_index``: this engine's place in the pool (``agentrl.cluster.engines.pool``),
    for logs and error messages only. Every engine starts with the same seed
    (``run.seed``); what an episode samples depends only on its request's ``sample_seed``
    (turn k is seeded ``sample_seed * 1009 + k``), so an episode does not depend on which
    engine ran it, nor on what else that engine batched with it, beyond floating-point
    numerics of the batched forward pass.

    ``sandbox_hosts``: with ``cluster.sandbox_hosts > 0``, the ``SandboxHostRef``s of
    ``start_sandbox_hosts``; its environments' sandboxes then run on them
    (``EnvFactory``), else in this process.

    Judges: ``reward.judge``'s scorer judges the training episodes (made at construction);
    ``eval.judge``'s (``rollout_scorer(..., role="eval")``, over the service
    ``agentrl-judge-eval-<run_id>``) judges the episodes of a ``rollout`` call whose budget
    says ``judge="eval"``, made at the first such call (the driver, or ``agentrl eval``,
    starts that service only when evals run).
    """

    def __init__(self, cfg_dict: dict, model_path: str, run_id: str, engine_index: int = 0,
                 sandbox_hosts: Sequence[Any] | None = None) -> None:
        from transformers import AutoTokenizer  # heavy: transformers

        cfg = Config.model_validate(cfg_dict)
        self.cfg = cfg
        self.run_id = run_id
        self.engine_index = engine_index
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        chat = ChatTokenizer(tokenizer, stop_token_ids(model_path, tokenizer))
        if cfg.rollout.check_template and cfg.rollout.prompt_mode == "full_history":
            environments.import_env_modules(cfg.env.import_modules)
            check_chat_template(chat, cfg, environments.env_class(cfg.env.id))
        t0 = time.perf_counter()
        self.engine = VLLMEngine(model_path, dtype=cfg.model.dtype, max_model_len=cfg.rollout.max_context_tokens,
                                 seed=cfg.run.seed, kv_cache_gb=cfg.rollout.kv_cache_gb, max_num_seqs=cfg.rollout.max_num_seqs,
                                 decode=tokenizer.decode)
        self.engine_start_s = time.perf_counter() - t0
        self.worker = RolloutWorker(
            self.engine, chat, EnvFactory(cfg, run_id, sandbox_hosts, engine_index=engine_index),
            RolloutLimits(cfg.rollout.max_turns, cfg.rollout.max_new_tokens, cfg.rollout.max_context_tokens,
                          score_truncated=cfg.rollout.score_truncated, prompt_mode=cfg.rollout.prompt_mode,
                          history_length=cfg.rollout.history_length, stop_strings=tuple(cfg.rollout.stop_strings)),
            sampling_of(cfg), env_workers=cfg.rollout.env_workers, env_timeout_s=cfg.rollout.env_timeout_s,
            judge=rollout_scorer(cfg, run_id),  # reward.judge: episodes judged as they end; None: the rule alone
        )
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

    def gateway_backend(self) -> dict:
        """This process's gateway, as a ``GatewayRouter`` backend (``agentrl.gateway.router``),
        started if it is not yet: ``{"gateway_id": str (8 hex chars), "base_url":
        "http://<host>:<port>"}``. ``host`` is the gateway's own address, or this node's IP
        when it listens on every address (``0.0.0.0`` / ``::``)."""
        server = gateway()
        host = server.host
        if host in ("", "0.0.0.0", "::"):
            host = ray.util.get_node_ip_address()
        if ":" in host:  # an IPv6 address in a URL is bracketed
            host = f"[{host}]"
        return {"gateway_id": server.gateway_id, "base_url": f"http://{host}:{server.port}"}

    def set_gateway_router(self, url: str) -> None:
        """The run's one gateway address (``agentrl.cluster.engines.gateway_router``), which
        agents of this process get as ``task.shared_base_url``."""
        set_router_url(url)

    def pool_stats(self) -> dict | None:
        """Warm-pool statistics (start-up and acquire latencies), or None without a pool."""
        pool = getattr(self.worker.env_factory, "pool", None)
        return None if pool is None else asdict(pool.stats())

    def rollout(self, requests: Sequence[Any], policy_version: int,
                budget: RolloutBudget | None = None) -> tuple[list[Episode], float]:
        """Run ``requests`` to the end; ``(episodes in request order, seconds)``. ``budget``
        (e.g. ``agentrl.driver.evaluation.eval_budget``): this call's limits, sampling and,
        when it carries them, the env kwargs its envs are made with (the eval judge's,
        ``agentrl.driver.judge``), passed to ``RolloutWorker.run``; ``budget.judge == "eval"``:
        the episodes are scored by ``eval.judge`` (class docstring); None: the run's.

        Raises:
            ConfigError: an eval-judged budget while ``eval.judge`` is unset or its service is
                not running.
        """
        self._not_streaming("rollout")
        t0 = time.perf_counter()
        first = requests[0] if requests else None
        self._rollout_progress = [0, len(requests), f"{first.run_id}/{first.iteration}" if first is not None else ""]

        def finished(_episode: Episode) -> None:
            self._rollout_progress[0] += 1

        if budget is not None and budget.judge == "eval" and self.worker.eval_judge is None:
            self.worker.eval_judge = rollout_scorer(self.cfg, self.run_id, role="eval")  # None: eval.judge unset
        episodes = self.worker.run(requests, policy_version, on_episode=finished, budget=budget)
        return episodes, time.perf_counter() - t0

    @ray.method(concurrency_group="stream")
    def rollout_progress(self) -> tuple[int, int, str]:
        """``(finished, requested, "run_id/iteration" of its first request)`` episodes of the
        ``rollout`` call running now (or the last one; ``(0, 0, "")`` before any): answered
        while it runs (another concurrency group), for progress bars
        (``agentrl.cluster.engines.progress``)."""
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

    # -- weight sync (agentrl.cluster.engines.weight_sync) --
    def _weight_receiver(self) -> Any:
        if getattr(self, "_weights_in", None) is None:
            from agentrl.cluster.engines.weight_sync import WeightReceiver  # heavy: torch

            self._weights_in = WeightReceiver()
        return self._weights_in

    def _load_target(self, policy_version: int | None, mode: str) -> Any:
        """The engine (no stream: load now, nothing is in flight) or a proxy that hands the
        load to the stream's loop thread (applied between engine steps per ``mode``)."""
        if mode not in LOAD_MODES:
            raise ConfigError(f"weight load mode={mode!r} is not one of {list(LOAD_MODES)} (controller.partial_rollout)")
        if policy_version is not None and int(policy_version) < 0:
            raise ConfigError(f"policy_version={policy_version} must be >= 0")
        if self.stream.running:
            return LoadProxy(self.stream, policy_version, mode)
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
