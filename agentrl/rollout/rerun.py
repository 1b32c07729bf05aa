"""Replay one recorded episode in a fresh environment and compare, turn by turn.

``rerun_episode(episode, env_factory)`` makes the environment the way the rollout does
(``env_factory(request)`` → ``(env, sandbox)``: the same env id, through the gymnasium
registry, with a fresh sandbox), resets it with the episode's seed and task id, steps it with
each turn's recorded ``action_text`` (the decoded completion the environment saw), and
checks, per turn:

* ``state``: the anchor before the action (``info["anchor"]``, else the observation, as
  ``StepInfo.anchor_or`` gives it to the rollout). On turn 0 it checks the reset.
* ``observation``: the observation after the action, against ``Turn.observation_text``.
* ``reward``: the reward after the action, against ``Turn.reward`` (exact: a deterministic
  environment returns the same float; the store keeps it bit-exact).
* ``done``: ``terminated`` / ``truncated``: false on every turn before the last, and on the
  last what the recorded termination reason implies (``env_terminated`` → terminated,
  ``env_truncated`` → truncated, ``max_turns`` / ``context_limit`` → neither).

The rollout loop's own rules are applied as it applied them (``agentrl.rollout.loop``): a
completion cut by ``max_new_tokens`` is not handed to the environment when
``score_truncated`` is off, and an unparseable cut answer earns 0 (a length stop is not a format failure;
docs/cases.md, C08a).

An exception from the environment or its sandbox is never a divergence. An
``InfraError`` (sandbox failure, lost container), an environment contract violation or a
reward-function fault ends the rerun with outcome ``error``, unless the recorded episode
ended with the same error type at the same turn (then that turn is ``reproduced``). A turn
whose recorded step failed and whose rerun step does not is ``error_not_reproduced``: an
infrastructure fault of the recording is reported, not counted as a divergence.
"""

from __future__ import annotations

import difflib
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable, Literal

from agentrl.errors import ContractError, EnvError, InfraError
from agentrl.rollout.loop import EnvFactory, _check_step_output
from agentrl.types import Episode, EpisodeRequest, StepInfo, TerminationReason, Turn

Outcome = Literal["same", "different", "error"]
TurnStatus = Literal["same", "different", "not_executed", "reproduced", "error_not_reproduced", "not_reached", "error"]

_DIFF_CONTEXT_LINES = 3
_MAX_TEXT_CHARS = 20_000  # recorded/rerun texts kept in the report (the diff is computed on the whole text)


@dataclass(frozen=True)
class FieldCheck:
    """One checked field of one turn that differs.

    Attributes:
        field: ``state`` | ``observation`` | ``reward`` | ``done``.
        recorded: the stored value, as text (cut to 20,000 characters).
        rerun: the rerun's value, as text (cut likewise).
        diff: ``difflib.unified_diff`` of the two texts (``--- recorded`` / ``+++ rerun``),
            three lines of context.
    """

    field: str
    recorded: str
    rerun: str
    diff: str


@dataclass(frozen=True)
class TurnCheck:
    """The comparison of one recorded turn (``turn_index`` 0-based, as stored).

    ``status``: ``same`` | ``different`` | ``not_executed`` (a cut completion the rollout did
    not hand to the environment) | ``reproduced`` (the recorded error happened again) |
    ``error_not_reproduced`` | ``not_reached`` (the rerun stopped before it) | ``error``.
    ``fields`` holds the fields that differ (empty when the turn is the same).
    """

    turn_index: int
    status: TurnStatus
    recorded_reward: float | None
    rerun_reward: float | None
    fields: tuple[FieldCheck, ...] = ()
    note: str = ""

    @property
    def same(self) -> bool:
        return self.status not in ("different", "error")


@dataclass
class RerunReport:
    """Result of ``rerun_episode``.

    Attributes:
        outcome: ``same`` (every turn equal), ``different`` (``first_divergent_turn`` is the
            first turn that is not) or ``error`` (the rerun could not be carried out:
            ``error`` says why; nothing about the environment's determinism follows).
        turns: one ``TurnCheck`` per recorded turn, in order.
        error: ``{"type", "message", "turn_index"}`` when ``outcome == "error"``.
        backend: the sandbox backend used (``None`` for an env without a sandbox), filled by
            the caller that made the factory.
        duration_s: wall-clock seconds of the rerun (environment made, reset, stepped, closed).
    """

    episode_id: str
    env_id: str
    task_id: str
    seed: int
    outcome: Outcome
    first_divergent_turn: int | None
    turns: list[TurnCheck] = field(default_factory=list)
    error: dict[str, Any] | None = None
    backend: str | None = None
    duration_s: float = 0.0

    @property
    def same(self) -> bool | None:
        """True / False for ``same`` / ``different``; None after an error."""
        return None if self.outcome == "error" else self.outcome == "same"

    @property
    def exit_code(self) -> int:
        """``agentrl replay rerun``'s exit status: 0 same, 1 different, 2 error."""
        return {"same": 0, "different": 1, "error": 2}[self.outcome]

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-serializable data (what the replay store's ``reruns`` table keeps)."""
        out = asdict(self)
        out["same"] = self.same
        return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_TEXT_CHARS else text[:_MAX_TEXT_CHARS] + f"\n[... {len(text) - _MAX_TEXT_CHARS} more characters]"


def field_diff(name: str, recorded: Any, rerun: Any) -> FieldCheck:
    """A ``FieldCheck`` for two values that differ, with their unified diff (line based;
    values that are not ``str`` are compared as their ``repr``)."""
    a, b = _text(recorded), _text(rerun)
    lines = list(difflib.unified_diff(a.splitlines(), b.splitlines(), fromfile="recorded", tofile="rerun",
                                      n=_DIFF_CONTEXT_LINES, lineterm=""))
    diff = "\n".join(lines) + "\n" if lines else ""
    if not diff:  # equal lines but different values (e.g. a trailing newline): say so
        diff = f"--- recorded\n+++ rerun\n-{a!r}\n+{b!r}\n"
    return FieldCheck(name, _cut(a), _cut(b), _cut(diff))


def _anchor_equal(recorded: Hashable, rerun: Hashable) -> bool:
    # The store reads a non-literal anchor back as its repr (agentrl.replay.models.encode_anchor).
    if recorded == rerun:
        return True
    return isinstance(recorded, str) and not isinstance(rerun, str) and recorded == repr(rerun)


def _expected_done(episode: Episode, k: int) -> tuple[bool, bool] | None:
    """``(terminated, truncated)`` the env returned after turn ``k`` of the recording, or
    None where the loop did not look at them (a cut completion ends the episode anyway)."""
    turn = episode.turns[k]
    if turn.finish_reason == "length":
        return None
    if k < len(episode.turns) - 1:
        return (False, False)
    reason = episode.termination_reason
    if reason == TerminationReason.ENV_TERMINATED:
        return (True, False)
    if reason == TerminationReason.ENV_TRUNCATED:
        return (False, True)
    if reason in (TerminationReason.MAX_TURNS, TerminationReason.CONTEXT_LIMIT):
        return (False, False)
    return None


def _recorded_error_at(episode: Episode, k: int) -> str | None:
    """The error type the recording ended with at turn ``k``'s step, if it did: an
    ``infra_error`` / ``reward_error`` episode whose last turn has no reward failed in that
    turn's step (or its engine request was aborted); one whose last turn has a reward failed
    after the step (building the next prompt), which is not the environment's doing."""
    if episode.termination_reason not in (TerminationReason.INFRA_ERROR, TerminationReason.REWARD_ERROR):
        return None
    if k != len(episode.turns) - 1 or episode.turns[k].reward is not None:
        return None
    return str((episode.error or {}).get("type") or "error")


def request_for(episode: Episode) -> EpisodeRequest:
    """An ``EpisodeRequest`` for a fresh rollout of ``episode``'s env id, task and seed."""
    return EpisodeRequest(env_id=episode.env_id, task_id=episode.task_id, seed=int(episode.seed),
                          group_id=episode.group_id, sample_seed=0, run_id="")


def rerun_episode(episode: Episode, env_factory: EnvFactory, *, score_truncated: bool = True,
                  clock: Callable[[], float] = time.perf_counter) -> RerunReport:
    """Replay ``episode``'s recorded actions in a fresh environment from ``env_factory`` and
    compare each turn (module docstring). The environment and its sandbox are closed before
    it returns. Never raises for the environment's or the sandbox's faults: they become an
    ``error`` outcome (or a ``reproduced`` turn).

    Args:
        episode: the recorded episode (``ReplayStore.get_episode``).
        env_factory: ``request -> (env, sandbox or None)``, as the rollout worker gets it
            (e.g. ``agentrl.cluster.actors.env_factory.EnvFactory`` with the run's config).
        score_truncated: the run's ``rollout.score_truncated``.

    Returns:
        A ``RerunReport``; ``first_divergent_turn`` is 0-based (``Turn`` order, as stored).

    Raises:
        ContractError: ``episode`` has no turns (nothing was recorded to replay).
    """

    if not episode.turns:
        raise ContractError(f"episode {episode.episode_id!r} has no turns (termination "
                            f"{getattr(episode.termination_reason, 'value', None)}); there is nothing to replay")
    t0 = clock()
    report = RerunReport(episode.episode_id, episode.env_id, episode.task_id, int(episode.seed), "same", None)
    env = sandbox = None
    try:
        try:
            env, sandbox = env_factory(request_for(episode))
        except Exception as exc:  # a sandbox that does not start, an env that cannot be made
            return _error(report, exc, None, episode)
        _replay(report, episode, env, score_truncated)
    finally:
        for obj in (env, sandbox):
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # noqa: BLE001 - closing is best effort; the result stands
                    pass
        report.duration_s = clock() - t0
    return report


def _error(report: RerunReport, exc: BaseException, k: int | None, episode: Episode) -> RerunReport:
    report.outcome = "error"
    report.first_divergent_turn = None
    kind = "infrastructure" if isinstance(exc, InfraError) else ("environment" if isinstance(exc, EnvError) else "error")
    report.error = {"type": type(exc).__name__, "message": str(exc)[:2000], "turn_index": k, "kind": kind}
    done = {t.turn_index for t in report.turns}
    if k is not None and k not in done:
        t = episode.turns[k]
        report.turns.append(TurnCheck(k, "error", t.reward, None, note=f"{type(exc).__name__}: {str(exc)[:300]}"))
    for j in range(len(report.turns), len(episode.turns)):
        report.turns.append(TurnCheck(j, "not_reached", episode.turns[j].reward, None))
    return report


def _reset(env: Any, episode: Episode) -> tuple[str, StepInfo]:
    out = env.reset(seed=int(episode.seed), options={"task_id": episode.task_id})
    if not isinstance(out, tuple) or len(out) != 2 or not isinstance(out[0], str):
        raise EnvError(f"{episode.env_id}.reset returned {type(out).__name__}; expected (observation: str, info)")
    return out[0], StepInfo.from_info(out[1], env_id=episode.env_id, where="reset")


def _replay(report: RerunReport, episode: Episode, env: Any, score_truncated: bool) -> None:
    try:
        obs, info = _reset(env, episode)
    except Exception as exc:  # the recording's reset worked: it made the turns replayed here
        _error(report, exc, None, episode)
        return
    state: Hashable = info.anchor_or(obs)
    for k, turn in enumerate(episode.turns):
        check = _step_turn(report, episode, env, k, turn, state, score_truncated)
        if check is None:  # an error ended the rerun
            return
        tc, state, ended = check
        report.turns.append(tc)
        if tc.status == "different" and report.first_divergent_turn is None:
            report.outcome = "different"
            report.first_divergent_turn = k
        if ended and k < len(episode.turns) - 1:
            # the rerun's env ended the episode before the recording did: the remaining
            # recorded actions cannot be stepped
            report.turns.extend(TurnCheck(j, "not_reached", episode.turns[j].reward, None,
                                          note="the rerun's environment ended the episode earlier")
                                for j in range(k + 1, len(episode.turns)))
            return


def _step_turn(report: RerunReport, episode: Episode, env: Any, k: int, turn: Turn, state: Hashable,
               score_truncated: bool) -> tuple[TurnCheck, Hashable, bool] | None:
    diffs: list[FieldCheck] = []
    if not _anchor_equal(turn.anchor, state):
        diffs.append(field_diff("state", turn.anchor, state))
    if turn.finish_reason == "length" and not score_truncated:
        # the rollout gave this cut completion 0 without stepping the env (docs/cases.md, C08a)
        status: TurnStatus = "different" if diffs else "not_executed"
        return TurnCheck(k, status, turn.reward, 0.0, tuple(diffs), note="cut by max_new_tokens; not handed to the environment"), state, True
    recorded_error = _recorded_error_at(episode, k)
    try:
        obs, reward, terminated, truncated, info = _check_step_output(env.step(turn.action_text), episode.env_id)
    except Exception as exc:
        if recorded_error == type(exc).__name__:
            return TurnCheck(k, "different" if diffs else "reproduced", turn.reward, None, tuple(diffs),
                             note=f"the step raised {type(exc).__name__} again, as recorded"), state, True
        _error(report, exc, k, episode)
        return None
    if recorded_error is not None:
        return (TurnCheck(k, "different" if diffs else "error_not_reproduced", turn.reward, reward, tuple(diffs),
                          note=f"the recorded step raised {recorded_error}; the rerun's did not (not a divergence)"),
                info.anchor_or(obs), True)
    if turn.finish_reason == "length" and info.invalid_action:
        reward = 0.0  # an unparseable cut answer earns 0, as the loop scored it
    if obs != turn.observation_text:
        diffs.append(field_diff("observation", turn.observation_text, obs))
    if turn.reward is None or reward != turn.reward:
        diffs.append(field_diff("reward", turn.reward, reward))
    expected = _expected_done(episode, k)
    if expected is not None and (terminated, truncated) != expected:
        diffs.append(field_diff("done", f"terminated={expected[0]} truncated={expected[1]}",
                                f"terminated={terminated} truncated={truncated}"))
    return (TurnCheck(k, "different" if diffs else "same", turn.reward, reward, tuple(diffs)),
            info.anchor_or(obs), terminated or truncated)
