"""``EpisodeScorer``: the run's judge as the rollout sees it (``agentrl.rollout.judging``):
``submit(episode, item) -> Future[JudgeRecord]``.

Per episode, in a thread of the scorer's pool:

1. ``needs_judge`` (``reward.combine``): under ``rule_first`` a rule reward at or above
   ``rule_pass`` decides alone: no call is paid (``JudgeRecord.judged`` False).
2. The rubric renders the judge's prompt and schema (``Rubric.request``); the cache is asked
   first (key: judge model, rubric digest and prompt), then the judge (``complete``).
3. The answer is parsed against the rubric's schema. An answer that cannot be parsed is asked
   again, bypassing the cache (``parse_retries`` times); one still unparseable, or a judge
   that fails after its own retries, gives a record with ``reward`` None and ``error`` set:
   the episode becomes a reward error, never a 0. Only an answer that parsed is cached.
4. The judge's score and the rule's reward combine (``combine``) into ``JudgeRecord.reward``.

The judge and the cache are plain callables, so the same scorer runs over an endpoint client
in this process or over the run's judge service (``agentrl.cluster``), and tests give it a
scripted server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError, JudgeError
from agentrl.rewards.rubric import COMBINE_MODES, Rubric, combine, needs_judge
from agentrl.rewards.types import JudgeReply, JudgeRequest
from agentrl.types import Episode, JudgeItem, JudgeRecord

log = logging.getLogger(__name__)

CacheGet = Callable[[str], "str | None"]
CachePut = Callable[[str, str, str, str], None]  # (key, model, rubric digest, output)


class EpisodeScorer:
    """Judges episodes (module docstring).

    Args:
        rubric: what the judge scores by.
        complete: the judge call, ``JudgeRequest -> JudgeReply``; raises ``JudgeError``
            when the judge did not answer after its retries.
        model: the judge model's name (part of the cache key).
        combine_mode: ``judge``, ``rule_first`` or ``weighted`` (``reward.combine``).
        rule_weight: ``weighted``'s weight of the rule reward, in [0, 1].
        rule_pass: ``rule_first``'s rule reward at or above which the rule decides.
        success_threshold: the reward at or above which an episode with a judgement
            succeeded (``reward.success_threshold``; read by ``agentrl.rollout.judging``).
        judge_settings: what besides the model changes the judge's answer (e.g. its server,
            temperature, max_tokens, structured output: ``judge_service.judge_settings``),
            part of every cache key (``Rubric.request``).
        cache_get, cache_put: the judge cache (``ReplayStore.judge_cache_get`` / ``_put``
            behind them), or None for no cache.
        parse_retries: fresh judge calls after an unparseable answer.
        max_workers: episodes judged at once (the judge client limits its own concurrency
            too).

    Raises:
        ConfigError: an unknown ``combine_mode``, a weight outside [0, 1], a negative
            retry count or fewer than one worker.
    """

    def __init__(self, rubric: Rubric, complete: Callable[[JudgeRequest], JudgeReply], *, model: str,
                 combine_mode: str = "rule_first", rule_weight: float = 0.5, rule_pass: float = 1.0,
                 success_threshold: float = 0.5, judge_settings: Mapping[str, Any] | None = None,
                 cache_get: CacheGet | None = None, cache_put: CachePut | None = None, parse_retries: int = 1,
                 max_workers: int = 8) -> None:
        if combine_mode not in COMBINE_MODES:
            raise ConfigError(f"combine_mode={combine_mode!r}; expected one of {COMBINE_MODES}")
        if not 0.0 <= rule_weight <= 1.0:
            raise ConfigError(f"rule_weight={rule_weight!r}; expected a number in [0, 1]")
        if parse_retries < 0 or max_workers < 1:
            raise ConfigError(f"parse_retries={parse_retries!r}, max_workers={max_workers!r}; expected >= 0 and >= 1")
        self.rubric, self.model = rubric, model
        self._complete, self._get, self._put = complete, cache_get, cache_put
        self.combine_mode, self.rule_weight, self.rule_pass = combine_mode, rule_weight, rule_pass
        self.success_threshold = float(success_threshold)
        self.judge_settings = dict(judge_settings or {})
        self.parse_retries = parse_retries
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="agentrl-judge")
        self._lock = threading.Lock()
        self.stats = {"calls": 0, "cache_hits": 0, "parse_errors": 0, "failures": 0, "rule_decided": 0}

    @property
    def group_mode(self) -> bool:
        """The rubric judges a group's answers in one call: the rollout hands over whole
        groups (``submit_group``)."""
        return self.rubric.mode == "group"

    def submit(self, episode: Episode, item: JudgeItem) -> Future:
        """Judge ``episode`` (read as ``item``; single-mode rubric); the future's result is
        its ``JudgeRecord``.

        Raises:
            ConfigError: the rubric is a group rubric (``submit_group``).
        """
        if self.group_mode:
            raise ConfigError(f"rubric {self.rubric.name!r} judges groups; hand over a group with submit_group")
        if not needs_judge(item.rule_reward, self.combine_mode, self.rule_pass):
            self._count("rule_decided")
            fut: Future = Future()
            fut.set_result(self._decided(item))
            return fut
        return self._pool.submit(self._judge, episode.episode_id, item)

    def submit_group(self, episodes: list[Episode], items: list[JudgeItem]) -> Future:
        """Judge the episodes of one group in one call (group-mode rubric: answer ``i`` is
        ``items[i]``); the future's result is their ``JudgeRecord`` list, in order, each with
        ``group_position`` ``i``. Each episode's reward combines the judge's score of its
        answer with its own rule reward. No call is paid when the rule decides every one.

        Raises:
            ConfigError: a single-mode rubric, or ``episodes`` and ``items`` of different
                lengths or empty.
        """
        if not self.group_mode:
            raise ConfigError(f"rubric {self.rubric.name!r} judges one episode per call; use submit")
        if not items or len(items) != len(episodes):
            raise ConfigError(f"submit_group: {len(episodes)} episodes and {len(items)} items; expected the same "
                              "number, at least one")
        if not any(needs_judge(it.rule_reward, self.combine_mode, self.rule_pass) for it in items):
            self._count("rule_decided", len(items))
            fut: Future = Future()
            fut.set_result([self._decided(it, i) for i, it in enumerate(items)])
            return fut
        return self._pool.submit(self._judge_group, episodes[0].group_id, items)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- internals -----------------------------------------------------------------------
    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    def _record(self, item: JudgeItem, **kw) -> JudgeRecord:
        return JudgeRecord(model=kw.pop("model", self.model), rubric=self.rubric.name,
                           rubric_digest=self.rubric.digest(), mode=self.rubric.mode, rule_reward=item.rule_reward,
                           **kw)

    def _decided(self, item: JudgeItem, position: int | None = None) -> JudgeRecord:
        reward = combine(item.rule_reward, None, self.combine_mode, self.rule_weight, self.rule_pass)
        return self._record(item, judged=False, reward=reward, group_position=position, error=None
                            if reward is not None else f"reward.combine={self.combine_mode!r} needs the rule reward, "
                            "and the episode has none")

    def _judge_group(self, group_id: str, items: list[JudgeItem]) -> list[JudgeRecord]:
        try:
            req = self.rubric.request(items, self.model, self.judge_settings)
        except ConfigError as exc:  # the rubric cannot render these items: the judge's side, never 0
            return [self._decided(it, i) if not needs_judge(it.rule_reward, self.combine_mode, self.rule_pass)
                    else self._record(it, group_position=i, error=str(exc)[:2000]) for i, it in enumerate(items)]
        prompt = [dict(m) for m in req.messages]
        out = self._ask(f"group {group_id}", req, lambda text: self.rubric.parse_group(text, len(items)))
        records, first = [], True
        for i, it in enumerate(items):
            if not needs_judge(it.rule_reward, self.combine_mode, self.rule_pass):
                records.append(self._decided(it, i))  # the rule decides, whatever the call gave
                continue
            # the call is the group's: counted on its first judged member only
            fields = out.fields() if first else dict(out.fields(), calls=0, parse_errors=0, latency_s=0.0)
            first = False
            if out.error is not None:
                records.append(self._record(it, group_position=i, prompt=prompt, **fields))
                continue
            j = out.parsed[i]
            reward = combine(it.rule_reward, j.score, self.combine_mode, self.rule_weight, self.rule_pass)
            records.append(self._record(it, group_position=i, prompt=prompt, scores=dict(j.scores),
                                        reasons=dict(j.reasons), score=j.score, gate_failed=j.gate_failed,
                                        reward=reward, **fields))
        return records

    def _judge(self, episode_id: str, item: JudgeItem) -> JudgeRecord:
        try:
            req = self.rubric.request(item, self.model, self.judge_settings)
        except ConfigError as exc:  # the rubric cannot render this item: the judge's side, never 0
            return self._record(item, error=str(exc)[:2000])
        prompt = [dict(m) for m in req.messages]
        out = self._ask(f"episode {episode_id}", req, self.rubric.parse)
        if out.error is not None:
            return self._record(item, prompt=prompt, **out.fields())
        j = out.parsed
        reward = combine(item.rule_reward, j.score, self.combine_mode, self.rule_weight, self.rule_pass)
        return self._record(item, prompt=prompt, scores=dict(j.scores), reasons=dict(j.reasons), score=j.score,
                            gate_failed=j.gate_failed, reward=reward, **out.fields())

    def _ask(self, what: str, req: JudgeRequest, parse: Callable[[str], Any]) -> _Answer:
        """The judge's parsed answer to ``req``: the cache first, then the judge, a fresh call
        after an unparseable answer (``parse_retries``); an answer that parsed is cached."""
        text, model, latency_s, cached = None, self.model, 0.0, False
        if self._get is not None:
            try:
                text = self._get(req.cache_key)
            except Exception:  # noqa: BLE001 - a cache that fails is a miss, never the episode's end
                log.warning("the judge cache failed on a lookup; asking the judge", exc_info=True)
            cached = text is not None
        errors: list[str] = []
        calls, last_text = 0, None
        for attempt in range(self.parse_retries + 1 + int(cached)):
            if text is None:
                t0 = time.monotonic()
                try:
                    self._count("calls")
                    calls += 1
                    reply = self._complete(req)
                except JudgeError as exc:
                    self._count("failures")
                    return _Answer(None, model, last_text, time.monotonic() - t0, False, calls, len(errors),
                                   str(exc)[:2000])
                text, model, latency_s, cached = reply.text, reply.model, reply.latency_s, reply.cached
            else:
                self._count("cache_hits")
            try:
                parsed = parse(text)
            except JudgeError as exc:
                self._count("parse_errors")
                errors.append(f"attempt {attempt + 1}{' (cached)' if cached else ''}: {exc}")
                log.warning("the judge's answer for %s could not be parsed: %s", what, exc)
                last_text, text, cached = text, None, False
                continue
            if self._put is not None and not cached:
                try:
                    self._put(req.cache_key, model, self.rubric.digest(), text)
                except Exception:  # noqa: BLE001 - not cached: the next identical call pays again
                    log.warning("the judge cache failed on a write", exc_info=True)
            return _Answer(parsed, model, text, latency_s, cached, calls, len(errors), None)
        return _Answer(None, model, last_text, latency_s, False, calls, len(errors),
                       ("the judge's answer could not be parsed: " + "; ".join(errors))[:2000])


@dataclass
class _Answer:
    """What ``EpisodeScorer._ask`` got: the parsed answer, or ``error``."""

    parsed: Any
    model: str
    output: str | None
    latency_s: float
    cached: bool
    calls: int
    parse_errors: int
    error: str | None

    def fields(self) -> dict[str, Any]:
        """The ``JudgeRecord`` fields this answer fills."""
        return {"model": self.model, "output": self.output, "latency_s": self.latency_s, "cached": self.cached,
                "calls": self.calls, "parse_errors": self.parse_errors, "error": self.error}
