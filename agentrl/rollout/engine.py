"""The inference engine: vLLM in-process, token ids in and out.

``VLLMEngine`` wraps ``vllm.LLM``'s engine for continuous batching: requests are added
one at a time (``add``) and ``step`` returns those that finished, so an episode's next turn
can be queued while others still generate.

Preemption (partial rollouts across a weight update): vLLM's ``engine.step()`` returns
cumulative outputs (``RequestOutputKind.CUMULATIVE``, the default) for unfinished requests
too; ``step`` keeps the latest one per request, so ``preempt`` can abort requests and hand
back what each had sampled so far. ``update_weights`` then resets the prefix cache and
checks the result: vLLM returns False (and keeps every cached block) while any request
holds KV blocks, which is an ``EngineError`` here, never ignored.

Log-probs: vLLM is started with ``logprobs_mode="processed_logprobs"`` so the log-prob of
each sampled token is taken from the distribution it was *sampled* from (after
temperature), which is what ``behavior_log_probs`` means and what the trainer recomputes
(docs/design.md, invariant 4; docs/cases.md, C04). vLLM's default (``raw_logprobs``) would ignore the
temperature.

Guided decoding (the local judge pool, ``agentrl.cluster.actors.judge_pool``): an engine
started with ``guided_decoding=True`` takes ``add(..., json_schema=...)``, which constrains the
request's output to the schema (vLLM's ``SamplingParams(structured_outputs=
StructuredOutputsParams(json=schema))``, xgrammar backend, compact JSON: no whitespace between
tokens). vLLM compiles the grammar over the model's vocabulary, so such an engine loads vLLM's
tokenizer (the rollout's engines skip it); a request without ``json_schema`` samples as usual.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from agentrl.errors import EngineError
from agentrl.rollout.stop_strings import StopCheck, cut_at_stop
from agentrl.types import FinishReason, SamplingRecord

log = logging.getLogger(__name__)


def configure_vllm_env(kv_cache_gb: float, num_threads: int | None = None) -> None:
    """Environment variables vLLM's CPU build reads at import (platform notes): in-process
    engine, no reserved core. Must run before ``import vllm``.

    ``VLLM_CPU_KVCACHE_SPACE`` gets ``kv_cache_gb`` rounded to whole GiB (at least 1), the
    only unit it takes, for whatever else in this process reads it; ``VLLMEngine`` itself
    passes the exact size as ``kv_cache_memory_bytes`` (``rollout.kv_cache_gb=0.25`` was 1 GiB,
    allocated and zeroed at every engine start)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, int(round(kv_cache_gb))))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if num_threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(num_threads)


class _NoCompile:
    """``with _no_compile:`` runs vLLM's ``torch.compile``'d helpers eagerly while the engine works.

    With ``enforce_eager`` the model is not compiled, but vLLM's sampler still
    ``torch.compile``s (Inductor) one small helper, the rank of each sampled token's log-prob
    (``batched_count_greater_than``: an integer count, the same eagerly): every engine start
    paid that compile, a C++ build included, at its first step (measured 2.3-4 CPU-s per
    engine start on 2 cores, and more for a new batch shape); ``step``, ``prompt_log_probs``
    and the start-up (its warm-up) run under it. ``torch.compiler.set_stance(
    "force_eager")`` is process-wide, so the first engine call enters it and the last one
    leaves it (calls from several threads nest); nothing else in the process is affected
    while no engine call runs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._stance: Any = None  # the set_stance context while depth > 0

    def __enter__(self) -> None:
        import torch

        with self._lock:
            if self._depth == 0:
                self._stance = torch.compiler.set_stance("force_eager")  # in effect from here
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                stance, self._stance = self._stance, None
                stance.__exit__(None, None, None)  # back to the stance before the first entry


_no_compile = _NoCompile()


def _no_chat_warmup_warning(record: logging.LogRecord) -> bool:
    """Drops vLLM's "Chat template warmup failed" (``skip_tokenizer_init``: no tokenizer)."""
    return not str(record.msg).startswith("Chat template warmup failed")


@dataclass(frozen=True)
class Completion:
    """One finished request.

    Attributes:
        request_id: as given to ``add``.
        token_ids: sampled ids ``[n]`` (the stop token included when one was sampled).
        log_probs: ``[n]`` nats, log-prob of each sampled id under the sampling transform.
        finish_reason: ``stop`` | ``length`` | ``abort``.
        stop_token_id: the stop id that ended it, if any.
    """

    request_id: str
    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: FinishReason
    stop_token_id: int | None


class VLLMEngine:
    """vLLM in this process.

    Args:
        model_path: local HF folder.
        dtype: ``float32`` (CPU default; keeps small updates) or ``bfloat16``.
        max_model_len: context window in tokens.
        seed: engine seed (requests also carry their own seeds).
        kv_cache_gb: CPU KV cache, GiB (fractions too: ``kv_cache_memory_bytes``).
        max_num_seqs: concurrent sequences.
        decode: the policy tokenizer's decode (special tokens kept); needed by requests
            with stop strings.
        logits_processors: vLLM V1 logits processors (``LogitsProcessor`` subclasses or
            their qualified names) applied to every request; none by default.
        guided_decoding: load vLLM's tokenizer so requests may carry ``json_schema``
            (module docstring); off for the rollout's engines.

    Raises:
        EngineError: vLLM failed to start.
    """

    guided_decoding: bool = False  # whether requests may carry json_schema (set by __init__)
    step_outputs: int = 0  # requests that advanced in the last step (0: it ran none, e.g. while grammars compile)

    def __init__(self, model_path: str, *, dtype: str = "float32", max_model_len: int = 2048, seed: int = 0,
                 kv_cache_gb: float = 1.0, max_num_seqs: int = 64,
                 decode: Callable[[Sequence[int]], str] | None = None,
                 logits_processors: Sequence[Any] = (), guided_decoding: bool = False) -> None:
        configure_vllm_env(kv_cache_gb)
        try:
            from vllm import LLM

            # vLLM's start-up runs several full garbage collections (and freezes the heap at
            # its end); with torch, transformers and vLLM imported each scans millions of
            # objects. Collected once here and frozen, they scan only what the engine makes
            # (about 1 s of CPU less per engine start on 2 cores).
            gc.collect()
            gc.freeze()
            # vLLM's chat-template warm-up needs the tokenizer it is told not to load; it
            # fails and logs a traceback as a warning. This engine never renders chats. (A
            # filter, not a level: vLLM's logging set-up during start-up resets the level.)
            renderer_log = logging.getLogger("vllm.renderers.base")
            renderer_log.addFilter(_no_chat_warmup_warning)
            # vLLM's CPU platform lets VLLM_CPU_KVCACHE_SPACE (whole GiB) override the exact
            # kv_cache_memory_bytes below: hidden while the engine reads its config
            kv_env = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
            try:
                with _no_compile:
                    self.llm = LLM(
                        model=model_path,
                        dtype=dtype,
                        enforce_eager=True,
                        max_model_len=max_model_len,
                        seed=seed,
                        max_num_seqs=max_num_seqs,
                        logprobs_mode="processed_logprobs",
                        enable_prefix_caching=True,
                        # Per-request seeds make sampling reproducible (resume replays the same
                        # tokens); vLLM's CPU generators cannot rewind the draw of a partially
                        # prefilled prompt ("CPU Generator does not use offset"), so prompts are
                        # never split across steps.
                        enable_chunked_prefill=False,
                        max_num_batched_tokens=max(max_model_len, 8192),
                        # Token ids in and out (the agent loop has its own tokenizer, and every
                        # EOS id is passed as a stop id): vLLM loads no tokenizer and detokenizes
                        # nothing (about 2 s of CPU less per engine start, and less per token);
                        # guided decoding needs it (grammars are compiled over the vocabulary).
                        skip_tokenizer_init=not guided_decoding,
                        # Fractions of a GiB too (VLLM_CPU_KVCACHE_SPACE: whole GiB only).
                        kv_cache_memory_bytes=max(1, int(kv_cache_gb * 2**30)),
                        **({"logits_processors": list(logits_processors)} if logits_processors else {}),
                        **({"structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}}
                           if guided_decoding else {}),
                    )
            finally:
                renderer_log.removeFilter(_no_chat_warmup_warning)
                if kv_env is not None:
                    os.environ["VLLM_CPU_KVCACHE_SPACE"] = kv_env
        except Exception as exc:  # vLLM raises many types on start-up failure
            raise EngineError(f"vLLM failed to start on model {model_path!r}: {type(exc).__name__}: {exc}") from exc
        self.engine = self.llm.llm_engine
        self.max_model_len = max_model_len
        self.guided_decoding = guided_decoding
        self._partial: dict[str, Any] = {}  # request id -> its latest cumulative CompletionOutput (None: none yet)
        self._reload_reason: str | None = None  # why update_weights last fell back to reload_weights
        self.decode = decode  # the policy tokenizer's decode: needed for requests with stop strings
        self._stops: dict[str, StopCheck] = {}  # request id -> its stop-string check

    def add(self, request_id: str, prompt_ids: Sequence[int], *, sampling: SamplingRecord, max_tokens: int,
            stop_token_ids: Sequence[int], seed: int | None = None, stop_strings: Sequence[str] = (),
            stop_context_ids: Sequence[int] = (), json_schema: dict[str, Any] | None = None) -> None:
        """Queue one request. ``prompt_ids`` ``[P]`` with ``P + max_tokens <= max_model_len``.
        ``stop_strings``: the request ends (``finish_reason="stop"``, ``stop_token_id`` None)
        with the token that completes the first of them in its text that ends a turn (the
        closing tag where it closes an open tool call, another stop string outside a call's
        JSON strings: ``agentrl.rollout.stop_strings``); needs the
        engine's ``decode``. ``stop_context_ids``: the turn's ids sampled before this
        request (the end of ``prompt_ids``, for a request that continues a preempted turn),
        read before the request's own ids when stop strings are looked for, so a tool call
        opened before the preemption keeps its string state. ``json_schema``: a JSON schema
        the output must satisfy (guided decoding; the engine must be started with
        ``guided_decoding=True``); None: unconstrained.

        Raises:
            EngineError: the request does not fit ``max_model_len``, stop strings without
                a ``decode``, or ``json_schema`` on an engine without ``guided_decoding``.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        if json_schema is not None and not self.guided_decoding:
            raise EngineError(f"request {request_id}: json_schema needs an engine started with "
                              "VLLMEngine(guided_decoding=True)")

        if stop_strings and self.decode is None:
            raise EngineError(f"request {request_id}: stop strings {list(stop_strings)} need the engine's decode "
                              "(VLLMEngine(decode=tokenizer.decode))")

        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise EngineError(
                f"request {request_id}: prompt of {len(prompt_ids)} tokens + max_tokens={max_tokens} "
                f"exceeds max_model_len={self.max_model_len}"
            )
        params = SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            max_tokens=max_tokens,
            stop_token_ids=list(stop_token_ids),
            logprobs=0,
            seed=seed,
            skip_special_tokens=False,
            structured_outputs=None if json_schema is None else StructuredOutputsParams(json=json_schema),
        )
        self.engine.add_request(request_id, {"prompt_token_ids": list(prompt_ids)}, params)
        self._partial[request_id] = None
        if stop_strings:
            self._watch_stops(request_id, stop_strings, stop_context_ids)

    def _watch_stops(self, request_id: str, stop_strings: Sequence[str], context_ids: Sequence[int]) -> None:
        """Start the stop-string check of a request; the turn's earlier ids are read at once."""
        check = StopCheck(stop_strings, [int(t) for t in context_ids])
        check.advance(self.decode, (), finished=False)
        self._stops[request_id] = check

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished_requests()

    def step(self) -> list[Completion]:
        """Run one engine step; return the requests that finished in it."""
        done: list[Completion] = []
        with _no_compile:
            outs = self.engine.step()
        self.step_outputs = len(outs)
        for out in outs:
            if not out.finished:
                self._partial[out.request_id] = out.outputs[0]  # cumulative: read at preemption only
                stopped = self._stopped(out.request_id, out.outputs[0])
                if stopped is not None:
                    self.abort([out.request_id])
                    done.append(stopped)
                continue
            self._partial.pop(out.request_id, None)
            o = out.outputs[0]
            stopped = self._stopped(out.request_id, o, finished=True)
            if stopped is not None:
                done.append(stopped)
                continue
            ids, lps = _ids_and_log_probs(out.request_id, o)
            reason = o.finish_reason if o.finish_reason in ("stop", "length") else "abort"
            stop_id = o.stop_reason if isinstance(o.stop_reason, int) else None
            if reason == "stop" and stop_id is None and ids:
                stop_id = ids[-1]
            done.append(Completion(out.request_id, ids, lps, reason, stop_id))
        return done

    def _stopped(self, request_id: str, o: Any, *, finished: bool = False) -> Completion | None:
        """The request's completion cut at its first stop string that ends the turn, if its
        newest text completes one (None otherwise, or for a request without stop strings).
        The turn's ids from before a preemption (``stop_context_ids``) are read first. Each
        step reads only the newest text (``StopWatch``); the cut itself is exact
        (``cut_at_stop`` over the whole turn)."""
        check = self._stops.pop(request_id, None) if finished else self._stops.get(request_id)
        if check is None:
            return None
        n = len(o.token_ids)
        c = len(check.context)
        if not check.advance(self.decode, o.token_ids, finished=finished):
            return None
        k = cut_at_stop(check.context + tuple(o.token_ids), self.decode, check.stops)
        if k is None:  # the tokenizer's text of the pieces differed from the whole's
            return None
        k = max(0, k - c)  # of this request's own ids
        if finished and o.finish_reason == "stop" and k == n - 1:
            return None  # only the stop token after it: the completion as vLLM ended it
        ids, lps = _ids_and_log_probs(request_id, o)
        return Completion(request_id, ids[:k], lps[:k], "stop", None)  # unfinished: the caller aborts it

    def abort(self, request_ids: Iterable[str]) -> None:
        ids = list(request_ids)
        self.engine.abort_request(ids)
        for rid in ids:
            self._partial.pop(rid, None)
            self._stops.pop(rid, None)

    def unfinished_ids(self) -> list[str]:
        """Ids of the requests added and not yet finished or aborted, in the order added."""
        return list(self._partial)

    def preempt(self, request_ids: Iterable[str]) -> list[Completion]:
        """Abort unfinished requests and return what each had sampled so far: ``Completion``
        with ``finish_reason="abort"``, ``token_ids`` ``[n]`` and ``log_probs`` ``[n]`` (nats,
        under the weights that sampled them; ``n`` may be 0 for a request not yet
        scheduled). Their KV blocks are freed.

        Raises:
            EngineError: an id that is not an unfinished request of this engine.
        """
        ids = list(request_ids)
        unknown = [r for r in ids if r not in self._partial]
        if unknown:
            raise EngineError(f"preempt: requests {unknown[:5]} are not unfinished requests of this engine")
        out = []
        for rid in ids:
            o = self._partial[rid]
            tok, lps = ((), ()) if o is None else _ids_and_log_probs(rid, o)
            out.append(Completion(rid, tok, lps, "abort", None))
        self.abort(ids)
        return out

    def reset_prefix_cache(self) -> None:
        """Drop every cached KV block (they were computed with the weights before a load).

        Raises:
            EngineError: vLLM refused (it does while a request holds blocks); names the
                requests still in the engine.
        """
        if not self.llm.reset_prefix_cache():
            raise EngineError(
                f"vLLM refused to reset the prefix cache: {self.engine.get_num_unfinished_requests()} requests still "
                f"hold KV blocks ({self.unfinished_ids()[:5]}); blocks computed under the old weights would be "
                "reused. Preempt, drain or abort them before loading weights"
            )

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]] | Mapping[str, Any]) -> str:
        """Load new weights in place and drop the prefix cache, whose KV entries were
        computed with the old weights (platform notes).

        Args:
            named_tensors: ``(hf_name, tensor)`` pairs (or a mapping) of the model's dtype,
                every weight once (a tied ``lm_head.weight`` may be left out). The tensors
                may be read-only views of a shared buffer; none is kept after the call.

        Returns:
            How they were loaded: ``"in_place"`` (``agentrl.rollout.weight_load``, vLLM's
            CPU build) or ``"reload_weights"`` (vLLM's generic reload, used wherever the
            in-place loader does not apply; the first such call logs why).

        Raises:
            EngineError: the prefix cache could not be reset (``reset_prefix_cache``): a
                request was still in flight. The weights are loaded by then; no block of
                the old weights is reused only once nothing holds blocks.
        """
        from agentrl.rollout.weight_load import load_in_place  # heavy: torch

        weights = dict(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        try:
            why_not = self.llm.apply_model(lambda model: load_in_place(model, weights))[0]
        except Exception as exc:  # a layer this loader misjudged: the generic reload below rewrites every weight
            why_not = f"the in-place load failed: {type(exc).__name__}: {exc}"
        if why_not is None:
            method = "in_place"
        else:
            if self._reload_reason is None:
                log.warning("weight sync uses vLLM's reload_weights (slower): %s", why_not)
            self._reload_reason = why_not
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
            method = "reload_weights"
        self.reset_prefix_cache()
        return method

    def prompt_log_probs(self, token_ids: Sequence[int]) -> list[float]:
        """Log-probs (temperature 1, nats) of ``token_ids[1:]`` given their prefixes, as the
        engine computes them; ``[len(token_ids) - 1]``. Used to prove weight sync."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        with _no_compile:
            out = self.llm.generate([{"prompt_token_ids": list(token_ids)}], params, use_tqdm=False)[0]
        plp = out.prompt_logprobs
        return [float(plp[i][token_ids[i]].logprob) for i in range(1, len(token_ids))]


def _ids_and_log_probs(request_id: str, o: Any) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Sampled ids and their log-probs from a vLLM ``CompletionOutput`` (cumulative).

    Raises:
        EngineError: a different number of log-prob entries than ids.
    """
    ids = tuple(int(t) for t in o.token_ids)
    if o.logprobs is None or len(o.logprobs) != len(ids):
        raise EngineError(
            f"request {request_id}: engine returned {len(ids)} ids but "
            f"{0 if o.logprobs is None else len(o.logprobs)} log-prob entries"
        )
    return ids, tuple(float(step_lp[tid].logprob) for step_lp, tid in zip(o.logprobs, ids))
