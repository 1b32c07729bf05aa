"""Row building, checks and the row ↔ ``Episode`` mapping of the replay store
(``agentrl.replay.store``); the column codecs themselves are in ``agentrl.replay.models``.

Every check raises ``ContractError`` naming the value and what was expected.
"""

from __future__ import annotations

import json
import math
import operator
import shlex
import statistics
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from agentrl.errors import ContractError
from agentrl.replay.models import (
    EpisodeRow,
    SandboxEventRow,
    TurnRow,
    decode_anchor,
    encode_anchor,
    pack_floats,
    pack_token_ids,
    unpack_floats,
    unpack_token_ids,
)
from agentrl.types import Episode, ExecResult, JudgeRecord, SamplingRecord, TerminationReason, Turn

CHUNK = 500
"""Ids per ``IN (...)`` clause; far below SQLite's and PostgreSQL's parameter limits."""


def chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), CHUNK):
        yield items[i:i + CHUNK]


def check_id(name: str, value: object) -> None:
    if not isinstance(value, str) or not value or len(value) > 200:
        raise ContractError(f"{name}={value!r}; expected a non-empty str of at most 200 characters")


def as_int(name: str, value: object, lo: int, hi: int) -> int:
    """``value`` as a Python int in ``[lo, hi]`` (numpy integers accepted, bools not)."""
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        v = None
    if isinstance(value, bool) or v is None or not lo <= v <= hi:
        raise ContractError(f"{name}={value!r}; expected an int in [{lo}, {hi}]")
    return v


def check_iteration(iteration: object) -> int:
    return as_int("iteration", iteration, 0, 2**31 - 1)


def json_object(name: str, value: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ContractError(f"{name} must be a dict; got {type(value).__name__}")
    try:
        return json.loads(json.dumps(dict(value), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ContractError(f"{name} is not JSON-serializable (NaN/inf not allowed): {exc}") from exc


def json_value(name: str, value: Any) -> Any:
    """``value`` as it reads back from a JSON column (tuples become lists); ``ContractError``
    when it is not JSON-serializable (NaN/inf included)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ContractError(f"{name} is not JSON-serializable (NaN/inf not allowed): {exc}") from exc


def check_digest(name: str, value: object) -> str:
    """``value`` if it is a ``str`` of at most 64 characters (a hex sha256: the judge's
    ``rubric_digest`` and cache keys), else ``ContractError``."""
    if not isinstance(value, str) or len(value) > 64:
        raise ContractError(f"{name}={value!r}; expected a hex sha256 (a str of at most 64 characters)")
    return value


def finite(what: str, value: float | None) -> float | None:
    if value is None:
        return None
    v = float(value)
    if not math.isfinite(v):
        raise ContractError(f"{what}={value!r} is not finite; record a failure as an error, not a value")
    return v


def episode_row(run_id: str, iteration: int, position: int, ep: Episode,
                 adv: Sequence[float | None] | None, now: datetime) -> dict[str, Any]:
    for name in ("episode_id", "group_id", "env_id"):
        check_id(f"episode.{name}", getattr(ep, name))
    if not isinstance(ep.task_id, str):
        raise ContractError(f"episode {ep.episode_id}: task_id={ep.task_id!r}; expected a str")
    seed = as_int(f"episode {ep.episode_id} seed", ep.seed, -(2**63), 2**63 - 1)
    if ep.termination_reason is not None and not isinstance(ep.termination_reason, TerminationReason):
        raise ContractError(f"episode {ep.episode_id}: termination_reason={ep.termination_reason!r}; "
                            "expected a TerminationReason or None")
    ep.validate()
    error = None if ep.error is None else json_object(f"episode {ep.episode_id} error", ep.error)
    adv_mean = None
    if adv is not None:
        if len(adv) != len(ep.turns):
            raise ContractError(f"episode {ep.episode_id}: {len(adv)} advantages for "
                                f"{len(ep.turns)} turns; expected one per turn")
        for k, a in enumerate(adv):
            if a is not None:  # None: the turn was left out of the loss (overlong filtering)
                finite(f"episode {ep.episode_id} turn {k} advantage", a)
        trained = [a for a in adv if a is not None]
        adv_mean = statistics.fmean(trained) if trained else None
    versions = [v for t in ep.turns for v in (t.policy_versions or [t.policy_version])]
    return {
        "episode_id": ep.episode_id,
        "run_id": run_id,
        "iteration": iteration,
        "position": position,
        "group_id": ep.group_id,
        "env_id": ep.env_id,
        "task_id": ep.task_id,
        "seed": seed,
        "terminated": bool(ep.terminated),
        "truncated": bool(ep.truncated),
        "termination_reason": None if ep.termination_reason is None else ep.termination_reason.value,
        "prompt_mode": ep.prompt_mode,
        "success": ep.success,
        "total_reward": finite(f"episode {ep.episode_id} total_reward", ep.total_reward),
        "error": error,
        "num_turns": len(ep.turns),
        "num_generated_tokens": ep.num_generated_tokens(),
        "policy_version_min": min(versions) if versions else None,
        "policy_version_max": max(versions) if versions else None,
        "advantage_mean": adv_mean,
        "counters": json_object(f"episode {ep.episode_id} counters", ep.counters) if ep.counters else None,
        "created_at": now,
    }


def judgement_row(ep: Episode, now: datetime) -> dict[str, Any] | None:
    """The ``judgements`` row of ``ep.judgement`` (None when the episode has none), written at
    ``now`` (UTC). ``ep`` is validated already (``JudgeRecord.validate``); raises
    ``ContractError`` for a prompt, scores or reasons that are not JSON."""
    j = ep.judgement
    if j is None:
        return None
    where = f"episode {ep.episode_id} judgement"
    return {
        "episode_id": ep.episode_id,
        "model": j.model,
        "rubric": j.rubric,
        "rubric_digest": check_digest(f"{where} rubric_digest", j.rubric_digest),
        "mode": j.mode,
        "prompt": json_value(f"{where} prompt", j.prompt),
        "output": j.output,
        "scores": json_value(f"{where} scores", j.scores),
        "reasons": json_value(f"{where} reasons", j.reasons),
        "score": finite(f"{where} score", j.score),
        "gate_failed": j.gate_failed,
        "rule_reward": finite(f"{where} rule_reward", j.rule_reward),
        "reward": finite(f"{where} reward", j.reward),
        "latency_s": float(j.latency_s),
        "cached": bool(j.cached),
        "judged": bool(j.judged),
        "calls": int(j.calls),
        "parse_errors": int(j.parse_errors),
        "group_position": None if j.group_position is None else int(j.group_position),
        "error": j.error,
        "created_at": now,
    }


def judge_record(r: Any) -> JudgeRecord:
    """The ``JudgeRecord`` of a ``judgements`` row (ORM row or result row with its columns)."""
    return JudgeRecord(
        model=r.model, rubric=r.rubric, rubric_digest=r.rubric_digest, mode=r.mode, prompt=list(r.prompt),
        output=r.output, scores={str(k): float(v) for k, v in r.scores.items()},
        reasons={str(k): str(v) for k, v in r.reasons.items()}, score=r.score, gate_failed=r.gate_failed,
        rule_reward=r.rule_reward, reward=r.reward, latency_s=r.latency_s, cached=bool(r.cached),
        judged=bool(r.judged), calls=int(r.calls), parse_errors=int(r.parse_errors), group_position=r.group_position, error=r.error,
    )


def judge_cache_rows(entries: Sequence[tuple[str, str, str, str]], now: datetime) -> list[dict[str, Any]]:
    """The ``judge_cache`` rows of ``entries`` (``(cache_key, model, rubric_digest, output)``),
    written at ``now`` (UTC), one per key: the first entry of a key repeated in ``entries``.

    Raises:
        ContractError: a key that is not 64 lowercase hex characters (a sha256), a model or
            output that is not a ``str``, a rubric digest longer than 64 characters.
    """
    rows: dict[str, dict[str, Any]] = {}
    for entry in entries:
        try:
            key, model, digest, output = entry
        except (TypeError, ValueError):
            raise ContractError(f"judge cache entry {entry!r}; expected (cache_key, model, rubric_digest, "
                                "output)") from None
        if not (isinstance(key, str) and len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
            raise ContractError(f"judge cache key {key!r}; expected a hex sha256 (64 lowercase hex characters)")
        for name, value in (("model", model), ("output", output)):
            if not isinstance(value, str):
                raise ContractError(f"judge cache entry {key}: {name}={value!r}; expected a str")
        check_digest(f"judge cache entry {key}: rubric_digest", digest)
        rows.setdefault(key, {"cache_key": key, "model": model, "rubric_digest": digest, "output": output,
                              "created_at": now})
    return list(rows.values())


def turn_row(ep: Episode, k: int, t: Turn, advantage: float | None) -> dict[str, Any]:
    where = f"episode {ep.episode_id} turn {k}"
    anchor, anchor_kind = encode_anchor(t.anchor)
    return {
        "episode_id": ep.episode_id,
        "turn_index": k,
        "prompt_ids": pack_token_ids(t.prompt_ids, what=f"{where} prompt_ids"),
        "completion_ids": pack_token_ids(t.completion_ids, what=f"{where} completion_ids"),
        "behavior_log_probs": pack_floats(t.behavior_log_probs, what=f"{where} behavior_log_probs"),
        "temperature": float(t.sampling.temperature),
        "top_p": float(t.sampling.top_p),
        "top_k": int(t.sampling.top_k),
        "policy_version": int(t.policy_version),
        "policy_versions": (None if all(v == t.policy_version for v in t.policy_versions)
                            else pack_token_ids(t.policy_versions, what=f"{where} policy_versions")),
        "finish_reason": t.finish_reason,
        "reward": finite(f"{where} reward", t.reward),
        "anchor": anchor,
        "anchor_kind": anchor_kind,
        "action_text": t.action_text,
        "observation_text": t.observation_text,
        "invalid_action": bool(t.invalid_action),
        "advantage": None if advantage is None else float(advantage),
        "branch": int(t.branch),
        "tool_calls": int(t.tool_calls),
    }


def event_row(episode_id: str, k: int, seq: int, r: ExecResult, now: datetime) -> dict[str, Any]:
    where = f"episode {episode_id} turn {k} exec result {seq}"
    if isinstance(r.command, str):
        command, argv = r.command, None
    else:
        argv = [str(a) for a in r.command]
        command = shlex.join(argv)
    return {
        "episode_id": episode_id,
        "turn_index": k,
        "seq": seq,
        "command": command,
        "argv": argv,
        "exit_code": r.exit_code,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "duration_s": finite(f"{where} duration_s", r.duration_s),
        "timed_out": bool(r.timed_out),
        "truncated_bytes": int(r.truncated_bytes),
        "created_at": now,
    }


def reason(value: str | None) -> TerminationReason | None:
    return None if value is None else TerminationReason(value)


def episode_from_rows(row: EpisodeRow | Any, turns: Sequence[TurnRow | Any],
                      events: Sequence[SandboxEventRow | Any], judgement: Any | None = None) -> Episode:
    """The ``Episode`` stored as ``row`` with its ``turns`` (in turn order), sandbox
    ``events`` (in turn, then ``seq`` order) and ``judgements`` row (None: no judgement): ORM
    rows, or result rows with the same column names (``agentrl.replay.read.get_episode``
    selects them with ``ReplayDB.columns_as_found``). A NULL ``counters`` reads as no counters."""
    by_turn: dict[int, list[ExecResult]] = {}
    for ev in events:
        by_turn.setdefault(ev.turn_index, []).append(ExecResult(
            command=ev.command if ev.argv is None else tuple(ev.argv),
            exit_code=ev.exit_code,
            stdout=ev.stdout,
            stderr=ev.stderr,
            duration_s=ev.duration_s,
            timed_out=ev.timed_out,
            truncated_bytes=ev.truncated_bytes,
        ))
    return Episode(
        episode_id=row.episode_id,
        group_id=row.group_id,
        env_id=row.env_id,
        task_id=row.task_id,
        seed=row.seed,
        turns=[
            Turn(
                prompt_ids=unpack_token_ids(t.prompt_ids),
                completion_ids=unpack_token_ids(t.completion_ids),
                behavior_log_probs=unpack_floats(t.behavior_log_probs),
                sampling=SamplingRecord(temperature=t.temperature, top_p=t.top_p, top_k=t.top_k),
                policy_version=t.policy_version,
                policy_versions=[] if t.policy_versions is None else unpack_token_ids(t.policy_versions),
                finish_reason=t.finish_reason,  # type: ignore[arg-type]
                reward=t.reward,
                anchor=decode_anchor(t.anchor, t.anchor_kind),
                action_text=t.action_text,
                observation_text=t.observation_text,
                invalid_action=t.invalid_action,
                exec_results=by_turn.get(t.turn_index, []),
                branch=t.branch,
                tool_calls=t.tool_calls,
            )
            for t in turns
        ],
        terminated=row.terminated,
        truncated=row.truncated,
        termination_reason=reason(row.termination_reason),
        error=row.error,
        prompt_mode=row.prompt_mode,
        success=row.success,
        counters={str(k): float(v) for k, v in (row.counters or {}).items()},
        judgement=None if judgement is None else judge_record(judgement),
    )


def finite_trainer_values(values: Mapping[str, Sequence[Any]] | None) -> tuple[dict[str, list[Any]], int]:
    """``values`` (``{episode_id: [per turn: (log_probs, entropies) or None]}``) with every
    turn whose log-probs or entropies hold a non-finite number (NaN, inf: a diverging update,
    which the trainer skips) set to ``None`` (stored as NULL, like a turn no update trained
    on), and how many turns that dropped. Diagnostic values never block an episode write."""
    out: dict[str, list[Any]] = {}
    dropped = 0
    for eid, per_turn in (values or {}).items():
        kept: list[Any] = []
        for pair in per_turn:
            if pair is not None and _has_nonfinite(pair):
                pair, dropped = None, dropped + 1
            kept.append(pair)
        out[eid] = kept
    return out, dropped


def _has_nonfinite(pair: Any) -> bool:
    try:
        return any(not math.isfinite(float(x)) for part in pair for x in part)
    except (TypeError, ValueError):
        return False  # malformed: left for ``trainer_value_updates`` to refuse by name


def trainer_value_updates(eps: Mapping[str, Episode], values: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Rows for an ORM bulk ``UPDATE turns`` by primary key: per turn of ``values``
    (``{episode_id: [per turn: (log_probs [C], entropies [C]) or None]}``) its packed
    ``trainer_log_probs`` and ``entropies`` (``<f8``). Checks lengths against the episodes
    ``eps`` and finiteness; raises ``ContractError`` naming the episode and turn."""
    out: list[dict[str, Any]] = []
    for eid, per_turn in values.items():
        ep = eps.get(eid)
        if ep is None:
            raise ContractError(f"trainer values given for episode_id={eid!r}, which is not in the batch")
        if len(per_turn) != len(ep.turns):
            raise ContractError(f"episode {eid}: trainer values for {len(per_turn)} turns; "
                                f"expected one entry (or None) per turn, {len(ep.turns)}")
        for k, pair in enumerate(per_turn):
            if pair is None:
                continue
            lps, ents = pair
            n = len(ep.turns[k].completion_ids)
            where = f"episode {eid} turn {k}"
            if len(lps) != n or len(ents) != n:
                raise ContractError(f"{where}: {len(lps)} trainer log-probs and {len(ents)} entropies; "
                                    f"expected one per completion id ({n})")
            lp_blob = pack_floats(lps, what=f"{where} trainer_log_probs")
            ent_blob = pack_floats(ents, what=f"{where} entropies")
            for name, blob in (("trainer_log_probs", lp_blob), ("entropies", ent_blob)):
                arr = unpack_floats(blob)
                if not all(math.isfinite(x) for x in arr):
                    raise ContractError(f"{where}: {name} holds a non-finite value")
            out.append({"episode_id": eid, "turn_index": k, "trainer_log_probs": lp_blob, "entropies": ent_blob})
    return out


def rerun_row(ep: EpisodeRow, same: bool, first_divergent_turn: int | None, report: Mapping[str, Any],
              now: datetime) -> dict[str, Any]:
    """The ``reruns`` row of a rerun of episode ``ep``; ``ContractError`` on bad input."""
    if same is not None and not isinstance(same, bool):
        raise ContractError(f"same={same!r}; expected a bool, or None when the rerun could not decide")
    if (same is False) != (first_divergent_turn is not None):
        raise ContractError(f"same={same} with first_divergent_turn={first_divergent_turn!r}; expected a turn "
                            "index exactly when the rerun differed (same=False)")
    turn = None
    if first_divergent_turn is not None:
        # a rerun may diverge one turn past the recorded ones (it ran longer), hence <= num_turns
        turn = as_int("first_divergent_turn", first_divergent_turn, 0, ep.num_turns)
    return {"episode_id": ep.episode_id, "created_at": now, "same": same, "first_divergent_turn": turn,
            "report": json_object("report", report)}
