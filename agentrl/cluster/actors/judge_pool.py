"""The local judge pool (``reward.judge.kind: pool``): ``reward.judge.num_engines`` vLLM engines
of the judge model (``reward.judge.model``, resolved like ``model.path``), never trained, each
decoding under the request's JSON schema (guided decoding, ``VLLMEngine(guided_decoding=True)``).

* ``JudgeEngine(cfg_dict, index)``: one engine in a threaded Ray actor placed with
  ``cluster.placement.judge``. ``complete`` renders the request's messages with the judge
  tokenizer's chat template (generation prompt added), queues them with the schema and waits;
  a background thread steps the engine, so every call in flight is batched in one engine.
* ``PoolJudge``: the ``Judge`` protocol over the engines; each call goes to the engine with the
  fewest calls in flight. A failed call is a ``JudgeError`` naming the engine (no retry: the
  episode becomes a reward error, never a 0).
* ``start_judge_pool(cfg)`` / ``stop_judge_pool(pool)``. The run's ``JudgeService``
  (``agentrl.cluster.actors.judge_service``) starts the pool in its own constructor, so the
  engines are its children: they end with it, whoever kills it.

Free text under a schema: no grammar forces a JSON string to end, and a weak model may write
one until ``max_tokens`` cuts the answer into text that does not parse. So each string of the
schema without a bound (``maxLength``, ``enum``, ``const``, ``pattern``, ``format``) gets a
``maxLength`` (``bounded_schema``): together at most half of ``reward.judge.max_tokens``
characters (so as many tokens at most), the other half left to keys, braces and numbers
(xgrammar writes a number with ``minimum`` and ``maximum`` with at most 6 decimals). Every
answer still satisfies the rubric's own schema.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Sequence

import ray

from agentrl.cluster.actors.actor_errors import actor_failure_message
from agentrl.cluster.actors.placement import role_options
from agentrl.config import Config
from agentrl.errors import ConfigError, JudgeError
from agentrl.model_zoo import resolve_model_path
from agentrl.rewards.endpoint import CHECK_PROMPT, CHECK_SCHEMA
from agentrl.rewards.types import JudgeReply, JudgeRequest
from agentrl.rollout.engine import Completion, VLLMEngine
from agentrl.types import SamplingRecord

log = logging.getLogger(__name__)

__all__ = ["ENGINE_START_TIMEOUT_S", "JudgeEngine", "PoolJudge", "bounded_schema", "pool_model_path",
           "start_judge_pool", "stop_judge_pool"]

ENGINE_START_TIMEOUT_S = 900.0
"""Seconds ``PoolJudge.check`` waits for an engine to load its model (beyond ``timeout_s``)."""
_CALL_MARGIN_S = 10.0  # beyond the engine's own timeout_s: its answer (or its timeout error) travels back
_IDLE_STEP_WAIT_S = 0.005  # after an engine step that ran no request
_STRING_SHARE = 0.5  # of max_tokens, in characters, for the schema's unbounded strings together
_BOUNDED_STRING_KEYS = ("maxLength", "enum", "const", "pattern", "format")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def bounded_schema(schema: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """A copy of ``schema`` whose unbounded strings (module docstring) get ``maxLength``:
    ``max(1, floor(max_tokens * 0.5 / n))`` characters, ``n`` the strings an answer can hold
    (a string inside an array of ``maxItems`` m counts m times; without ``maxItems``, once)."""
    out = copy.deepcopy(schema)
    found: list[dict[str, Any]] = []
    slots = _unbounded_strings(out, 1, found)
    if found:
        cap = max(1, int(max_tokens * _STRING_SHARE) // slots)
        for node in found:
            node["maxLength"] = cap
    return out


def _unbounded_strings(node: Any, times: int, found: list[dict[str, Any]]) -> int:
    """Appends the unbounded string schemas under ``node`` to ``found``; returns how many
    strings an answer can hold there (each counted ``times`` times)."""
    if not isinstance(node, dict):
        return 0
    kind, own = node.get("type"), 0
    if (kind == "string" or isinstance(kind, list) and "string" in kind) and not any(
            k in node for k in _BOUNDED_STRING_KEYS):
        found.append(node)
        own = times
    subs = [(sub, times) for key in _SCHEMA_MAPS for sub in (node.get(key) or {}).values()]
    subs += [(sub, times) for key in _SCHEMA_LISTS for sub in node.get(key) or ()]
    items, repeat = node.get("items"), node.get("maxItems")
    repeat = max(1, repeat) if isinstance(repeat, int) else 1
    subs += [(sub, times * repeat) for sub in (items if isinstance(items, list) else [items])]
    subs.append((node.get("additionalProperties"), times))
    return own + sum(_unbounded_strings(sub, t, found) for sub, t in subs)


def pool_model_path(cfg: Config) -> str:
    """The judge model's folder (``reward.judge.model``, resolved like ``model.path``), after
    checking the pool's settings.

    Raises:
        ConfigError: no pool judge configured, a model that does not resolve (named), or
            ``reward.judge.max_tokens`` that leaves no room for a prompt in
            ``reward.judge.max_context_tokens``.
    """
    j = cfg.reward.judge
    if j is None or j.kind != "pool":
        raise ConfigError(f"reward.judge.kind={None if j is None else j.kind!r}: expected 'pool' for a local "
                          "judge pool")
    if j.max_tokens >= j.max_context_tokens:
        raise ConfigError(f"reward.judge.max_tokens={j.max_tokens} must be below reward.judge.max_context_tokens="
                          f"{j.max_context_tokens} (the prompt needs room too)")
    try:
        return resolve_model_path(j.model)
    except ConfigError as exc:
        raise ConfigError(f"reward.judge.model={j.model!r} (kind: pool): {exc}") from None


@ray.remote
class JudgeEngine:
    """One vLLM engine of the judge pool (module docstring). Threaded (``max_concurrency``):
    each ``complete`` queues its request and waits on a future that the stepping thread
    resolves, so concurrent calls share engine steps.

    Raises (constructor):
        ConfigError: the model does not resolve, or its tokenizer has no chat template.
        EngineError: vLLM failed to start on it.
    """

    def __init__(self, cfg_dict: dict, index: int) -> None:
        from transformers import AutoTokenizer  # heavy: transformers
        from vllm.platforms import current_platform  # heavy: vllm

        t0 = time.monotonic()
        cfg = Config.model_validate(cfg_dict)
        j = cfg.reward.judge
        path = pool_model_path(cfg)
        self.index, self.model = index, j.model
        self.where = f"judge engine {index} ({j.model!r})"
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"reward.judge.model={j.model!r}: its tokenizer has no chat template to render the "
                              "judge's messages with")
        eos = self.tokenizer.eos_token_id  # vLLM adds the generation config's EOS ids itself (tokenizer loaded)
        self.stop_ids = () if eos is None else (int(eos),)
        self.dtype = "float32" if j.dtype == "auto" and current_platform.is_cpu() else j.dtype
        self.engine = VLLMEngine(path, dtype=self.dtype, max_model_len=j.max_context_tokens, seed=cfg.run.seed,
                                 kv_cache_gb=j.kv_cache_gb, max_num_seqs=j.max_concurrency, guided_decoding=True)
        self.sampling = SamplingRecord(temperature=j.temperature, top_p=1.0, top_k=-1)
        self.max_tokens, self.timeout_s = j.max_tokens, j.timeout_s
        self.start_s = time.monotonic() - t0
        self.steps = self.requests = self.tokens = self.peak_in_flight = 0
        self._ids = itertools.count()
        self._pending: dict[str, Future] = {}
        self._broken: str | None = None  # why the stepping thread stopped
        self._cv = threading.Condition()  # guards the engine, _pending and _broken
        threading.Thread(target=self._loop, name=f"judge-engine-{index}", daemon=True).start()

    def ready(self) -> dict[str, Any]:
        """``{"index", "model", "dtype", "start_s"}`` (the constructor's seconds) once it is up."""
        return {"index": self.index, "model": self.model, "dtype": self.dtype, "start_s": self.start_s}

    def stats(self) -> dict[str, int]:
        """``steps`` (engine steps that advanced a request), ``requests`` and ``tokens`` (answers
        and their sampled tokens), ``in_flight`` now and ``peak_in_flight``."""
        with self._cv:
            return {"steps": self.steps, "requests": self.requests, "tokens": self.tokens,
                    "in_flight": len(self._pending), "peak_in_flight": self.peak_in_flight}

    def complete(self, request: JudgeRequest) -> JudgeReply:
        """The judge's answer to ``request``: its messages rendered with the chat template,
        decoded under ``request.json_schema`` (strings bounded, ``bounded_schema``) at
        ``reward.judge.temperature`` for at most ``reward.judge.max_tokens`` tokens.

        Raises:
            JudgeError: naming this engine: the prompt does not fit
                ``reward.judge.max_context_tokens``, no answer within ``reward.judge.timeout_s``,
                or the engine failed.
        """
        start = time.monotonic()
        text = self.tokenizer.apply_chat_template(list(request.messages), tokenize=False, add_generation_prompt=True)
        prompt_ids = self.tokenizer.encode(text, add_special_tokens=False)
        schema = bounded_schema(request.json_schema, self.max_tokens)
        rid = f"judge{self.index}-{next(self._ids)}"
        future: Future = Future()
        with self._cv:
            if self._broken is not None:
                raise JudgeError(f"{self.where} is out of service: {self._broken}")
            try:
                self.engine.add(rid, prompt_ids, sampling=self.sampling, max_tokens=self.max_tokens,
                                stop_token_ids=self.stop_ids, json_schema=schema)
            except Exception as exc:  # EngineError (too long), or vLLM refusing the schema
                raise JudgeError(f"{self.where}: {type(exc).__name__}: {exc} (reward.judge.max_context_tokens="
                                 f"{self.engine.max_model_len}, reward.judge.max_tokens={self.max_tokens})") from None
            self._pending[rid] = future
            self.peak_in_flight = max(self.peak_in_flight, len(self._pending))
            self._cv.notify_all()
        try:
            done: Completion = future.result(timeout=self.timeout_s)
        except TimeoutError:
            with self._cv:
                if self._pending.pop(rid, None) is not None:
                    self.engine.abort([rid])
            raise JudgeError(f"{self.where} did not answer within reward.judge.timeout_s={self.timeout_s:g} "
                             "s") from None
        except Exception as exc:  # the stepping thread failed
            raise JudgeError(f"{self.where} failed: {type(exc).__name__}: {exc}") from None
        answer = self.tokenizer.decode(list(done.token_ids), skip_special_tokens=True)
        with self._cv:
            self.requests += 1
            self.tokens += len(done.token_ids)
        return JudgeReply(text=answer, model=self.model, latency_s=time.monotonic() - start)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self.engine.has_unfinished():
                    self._cv.wait()
                try:
                    finished = self.engine.step()
                except Exception as exc:  # noqa: BLE001 - every waiting call gets it
                    self._fail(f"engine step failed: {type(exc).__name__}: {exc}")
                    log.exception("%s: engine step failed", self.where)
                    return
                if not self.engine.step_outputs:  # nothing ran (grammars still compiling): no busy loop
                    self._cv.wait(_IDLE_STEP_WAIT_S)
                    continue
                self.steps += 1
                futures = [(self._pending.pop(c.request_id, None), c) for c in finished]
            for future, c in futures:
                if future is not None:
                    future.set_result(c)

    def _fail(self, why: str) -> None:
        """(Holding ``_cv``) mark the engine out of service and fail every waiting call."""
        self._broken = why
        pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(JudgeError(why))


class PoolJudge:
    """The ``Judge`` protocol over the engines of a local judge pool (module docstring).

    Args:
        engines: ``JudgeEngine`` actor handles, in index order.
        model: ``reward.judge.model`` (``JudgeReply.model`` and error messages).
        timeout_s: ``reward.judge.timeout_s``, the engines' own limit per call.

    Attributes:
        calls, retries, failures: ``complete`` calls made, retries (always 0: no retry), and
            calls that ended in ``JudgeError`` (for the judge metrics; ``check`` not counted).

    Raises:
        ConfigError: no engines.
    """

    def __init__(self, engines: Sequence[Any], model: str, timeout_s: float) -> None:
        if not engines:
            raise ConfigError("a judge pool needs at least one engine (reward.judge.num_engines >= 1)")
        self.engines, self.model, self.timeout_s = list(engines), model, float(timeout_s)
        self.calls = self.retries = self.failures = 0
        self._in_flight, self._sent = [0] * len(self.engines), [0] * len(self.engines)
        self._lock = threading.Lock()

    def complete(self, request: JudgeRequest) -> JudgeReply:
        """The answer of the engine with the fewest calls in flight (ties: fewest calls so far).

        Raises:
            JudgeError: the engine failed, died or did not answer in time (names it).
        """
        with self._lock:
            self.calls += 1
            i = min(range(len(self.engines)), key=lambda k: (self._in_flight[k], self._sent[k], k))
            self._in_flight[i] += 1
            self._sent[i] += 1
        try:
            return self._get(i, self.engines[i].complete.remote(request), self.timeout_s + _CALL_MARGIN_S)
        except JudgeError:
            with self._lock:
                self.failures += 1
            raise
        finally:
            with self._lock:
                self._in_flight[i] -= 1

    def check(self) -> None:
        """Every engine is up (waits up to ``ENGINE_START_TIMEOUT_S`` for its model to load)
        and answers one tiny call (``{"ok": true}`` under its schema) with JSON.

        Raises:
            JudgeError: an engine failed to start, did not answer, or answered text that is
                not JSON (names the engine).
        """
        for i, ref in enumerate([e.ready.remote() for e in self.engines]):
            info = self._get(i, ref, ENGINE_START_TIMEOUT_S, "failed to start")
            log.info("judge engine %d: %s (%s) up in %.1f s", i, self.model, info["dtype"], info["start_s"])
        probe = JudgeRequest(messages=({"role": "user", "content": CHECK_PROMPT},), json_schema=CHECK_SCHEMA,
                             cache_key="0" * 64)
        for i, ref in enumerate([e.complete.remote(probe) for e in self.engines]):
            text = self._get(i, ref, self.timeout_s + _CALL_MARGIN_S, "failed its health check").text
            try:
                answer = json.loads(text)
            except ValueError:
                answer = None
            # under the schema {"ok": boolean} a working engine writes that object (true or false:
            # a weak model's choice); anything else means its guided decoding does not hold
            if not (isinstance(answer, dict) and isinstance(answer.get("ok"), bool)):
                raise JudgeError(f"judge engine {i} ({self.model!r}) failed its health check: asked for "
                                 f"{{\"ok\": true}} under a JSON schema, it answered {text[:200]!r}")

    def _get(self, i: int, ref: Any, timeout_s: float, what: str = "failed") -> Any:
        """``ray.get`` of engine ``i``'s call; any failure a ``JudgeError`` naming the engine."""
        try:
            return ray.get(ref, timeout=timeout_s)
        except Exception as exc:
            raise self._error(i, exc, what, timeout_s) from None

    def _error(self, i: int, exc: BaseException, what: str, timeout_s: float) -> JudgeError:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, JudgeError):
            return JudgeError(str(cause))  # the engine's own message names it
        where = f"judge engine {i} of the pool ({self.model!r})"
        if isinstance(exc, ray.exceptions.GetTimeoutError):
            return JudgeError(f"{where} {what}: no answer within {timeout_s:g} s")
        if isinstance(exc, ray.exceptions.RayActorError):  # its constructor raised, or its process died
            return JudgeError(f"{where} {what}: {actor_failure_message(exc, f'judge engine {i}')}")
        return JudgeError(f"{where} {what}: {type(cause or exc).__name__}: {cause or exc}")


def start_judge_pool(cfg: Config) -> PoolJudge:
    """Start ``reward.judge.num_engines`` ``JudgeEngine`` actors (placed with
    ``cluster.placement.judge``) and return their ``PoolJudge`` at once; the engines load
    their model meanwhile (``PoolJudge.check`` waits for them). Ray must be up.

    Raises:
        ConfigError: a bad pool setting or a judge model that does not resolve
            (``pool_model_path``), checked before any actor starts.
    """
    pool_model_path(cfg)
    j = cfg.reward.judge
    cfg_dict = cfg.model_dump(mode="json")
    engines = [JudgeEngine.options(**role_options(cfg, "judge"), max_concurrency=j.max_concurrency + 4)
               .remote(cfg_dict, i) for i in range(j.num_engines)]
    return PoolJudge(engines, j.model, j.timeout_s)


def stop_judge_pool(pool: PoolJudge | None) -> None:
    """End the pool's engines (their calls in flight fail); None or engines already gone: nothing."""
    for engine in [] if pool is None else pool.engines:
        try:
            ray.kill(engine)
        except Exception:  # noqa: BLE001 - already gone
            pass
