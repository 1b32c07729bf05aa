"""Advantage estimators by name: what ``algorithm.advantage`` picks and training calls.

Every estimator is registered with its *level* and whether it needs a learned critic's
values, and is called with one signature per level (``agentrl.credit.assign_credit`` does
the calling; nothing here sees an ``Episode``):

* ``level="turn"``: ``fn(rewards, anchors, group_ids, values, params)`` →
  ``advantages``, one value per turn.
* ``level="token"``: ``fn(rewards, anchors, group_ids, values, turn_token_counts, params)``
  → ``advantages``, one value per sampled token in stream order.

Arguments (``N`` episodes, ``K_i`` turns and ``N_i`` sampled tokens in episode ``i``):

* ``rewards``: ``[N][K_i]`` floats, the shaped reward after each turn (invalid-action and
  overlong penalties applied);
* ``anchors``: ``[N][K_i]`` hashable state keys before each turn (``Turn.anchor``, GiGPO);
* ``group_ids``: ``[N]`` group keys (all rollouts of one task instance and seed);
* ``values``: ``None``, or with ``needs_values=True`` the critic's values, ``[N][K_i]``
  float64 arrays (turn level: ``V(s_k)`` at each turn boundary) or ``[N][N_i]`` (token
  level: the value of each sampled token, read at the token before it);
* ``turn_token_counts`` (token level only): ``[N][K_i]`` ints, sampled tokens per turn;
* ``params``: ``EstimatorParams`` (discounts, lambdas, std normalisation, GiGPO's step
  weight, normalisation mode and episode statistics).

Return ``[N]`` sequences of floats (``[K_i]`` or ``[N_i]`` each). With ``needs_values=True``
return ``(advantages, returns)``, the returns (same shapes) being the critic's regression
targets.

=============  =====  ======  =====  ==============================================
name           level  values  group  what
=============  =====  ======  =====  ==============================================
``grpo``       turn   no      >= 2   episode return vs its group (mean, std), every turn
``rloo``       turn   no      >= 2   leave-one-out mean, no std
``drgrpo``     turn   no      >= 2   group mean, no std (Dr. GRPO)
``gigpo``      turn   no      (2)    episode + anchor-state step groups (``gamma``,
                                     ``gigpo_*``)
``turn_critic`` turn  yes     1      turn-level GAE (``gamma``, ``lam`` per turn)
``gae``        token  yes     1      token-level GAE (``token_gamma``, ``token_lam``)
=============  =====  ======  =====  ==============================================

"group" is the registration's ``min_group_size`` (``(2)``: ``advised_group_size``, a
warning below it): a group-relative estimator compares each rollout with the other rollouts
of its group (``env.group_size`` of them), so with fewer than ``min_group_size`` every
advantage is 0 and nothing is learned; ``agentrl.credit.check_group_size`` refuses such a
run at start-up, for a user's estimator as for the built-ins.

Users add their own with ``register_estimator("my_adv", fn, level="turn")`` (or as a
decorator) in a module named in ``env.import_modules``, or in an installed package that
advertises the entry-point group ``agentrl.estimators`` (``ENTRY_POINT_GROUP``): a module
(importing it registers) or a callable (called once).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Literal

from agentrl.errors import ConfigError
from critics.gigpo import gigpo_advantages
from critics.grpo import grpo_advantages
from critics.turn_critic import token_critic_advantages, turn_critic_advantages

Level = Literal["turn", "token"]
LEVELS: tuple[str, ...] = ("turn", "token")
ENTRY_POINT_GROUP = "agentrl.estimators"
"""The entry-point group through which installed packages register estimators."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EstimatorParams:
    """The algorithm settings an estimator may read (``agentrl.credit`` fills it from
    ``AlgorithmConfig``; critics never import the config).

    Attributes:
        gamma: discount per step (gigpo) or per turn (turn_critic), in [0, 1].
        lam: GAE lambda per turn (turn_critic), in [0, 1].
        token_gamma: discount per sampled token (gae), in [0, 1].
        token_lam: GAE lambda per sampled token (gae), in [0, 1].
        norm_by_std: grpo divides by the group's std.
        gigpo_step_weight: GiGPO's ``omega`` in ``A = A_E + omega * A_S`` (Feng et al.
            2025, Eq. 8), finite.
        gigpo_mode: GiGPO's normalisation, ``"mean_norm"`` (``F = 1``) or
            ``"mean_std_norm"`` (``F = std + 1e-6``), at both levels (Eq. 3 and 7).
        gigpo_episode_stats: the samples of GiGPO's episode-level mean and std,
            ``"trajectory"`` (one per trajectory, the paper) or ``"step"`` (one per step,
            verl-agent's default).
    """

    gamma: float = 0.95
    lam: float = 1.0
    token_gamma: float = 1.0
    token_lam: float = 1.0
    norm_by_std: bool = True
    gigpo_step_weight: float = 1.0
    gigpo_mode: str = "mean_norm"
    gigpo_episode_stats: str = "trajectory"


@dataclass(frozen=True)
class Estimator:
    """One registration.

    Attributes:
        name: the ``algorithm.advantage`` value.
        fn: the function, with the signature of its ``level`` (module docstring).
        level: ``"turn"`` (one advantage per turn) or ``"token"`` (one per sampled token).
        needs_values: it reads a learned critic's values and returns ``(advantages,
            returns)``; training then fits the ``critic`` section's value model.
        min_group_size: the smallest ``env.group_size`` it can learn from; with fewer
            rollouts per group every advantage it returns is 0 (a group-relative baseline
            of one sample is that sample). 2 for grpo, rloo and drgrpo; 1 for an estimator
            that needs no group. A smaller group is refused at start-up.
        advised_group_size: below it (and at or above ``min_group_size``) a run starts
            with a warning: part of the signal is lost (gigpo: 2, its episode level).
        group_size_note: what a too-small group costs, in the estimator's own terms; the
            start-up error or warning quotes it.
    """

    name: str
    fn: Callable[..., Any]
    level: Level
    needs_values: bool
    min_group_size: int = 1
    advised_group_size: int = 1
    group_size_note: str = ""


ESTIMATORS: dict[str, Estimator] = {}
"""Registered estimators by name. Read it freely; add to it with ``register_estimator``."""

SIGNATURES: dict[str, str] = {
    "turn": "fn(rewards, anchors, group_ids, values, params)",
    "token": "fn(rewards, anchors, group_ids, values, turn_token_counts, params)",
}
"""The positional signature each level is called with (module docstring)."""

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")
_lock = threading.RLock()  # re-entrant: an entry point loaded under it registers under it
_entry_points_loaded = False  # set only once every entry point has been tried
_entry_points_loading = False  # the thread holding _lock is loading them (re-entry returns)
_entry_point_failures: dict[str, str] = {}
"""Entry points that failed to load: name -> ``"<value>: <ExcType>: <message>"``."""


def _check_signature(name: str, fn: Callable[..., Any], level: str) -> None:
    """Raise ``ConfigError`` unless ``fn`` accepts its level's positional arguments.

    A callable whose signature cannot be read (some C functions) is let through.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    n = len(SIGNATURES[level].split(","))
    try:
        sig.bind(*range(n))
    except TypeError as exc:
        raise ConfigError(
            f"estimator {name!r} (level={level!r}) has signature {name}{sig}, which cannot be called as "
            f"{SIGNATURES[level]} ({n} positional arguments: {exc}); give it that signature or register "
            f"it with the level it was written for"
        ) from None


def register_estimator(name: str, fn: Callable[..., Any] | None = None, *, level: str = "turn",
                       needs_values: bool = False, min_group_size: int = 1,
                       advised_group_size: int | None = None, group_size_note: str = "",
                       overwrite: bool = False) -> Any:
    """Register ``fn`` under ``name`` so ``algorithm.advantage: <name>`` trains with it.

    Usable as a call or, without ``fn``, as a decorator (``@register_estimator("x")``).
    The function should be pure (no I/O) and document its shapes, like the built-ins.

    Args:
        name: a letter followed by letters, digits, ``_``, ``.`` or ``-``.
        fn: the estimator, with the signature of ``level`` (module docstring).
        level: ``"turn"`` or ``"token"``.
        needs_values: it needs the critic's values and returns ``(advantages, returns)``.
        min_group_size: the smallest ``env.group_size`` with which its advantages can be
            non-zero: 2 for a group-relative estimator (each rollout against the other
            rollouts of its group), 1 (default) for one that needs no group. A run with a
            smaller group is refused at start-up (``agentrl.credit.check_group_size``).
        advised_group_size: a run with a group smaller than this (but at least
            ``min_group_size``) starts with a warning; ``None``: ``min_group_size``.
        group_size_note: one sentence on what a smaller group costs, quoted by that error
            or warning.
        overwrite: replace an existing registration (including a built-in) instead of
            raising.

    Returns:
        ``fn`` (or the decorator).

    Raises:
        ConfigError: bad name, ``fn`` not callable, a level other than ``"turn"`` /
            ``"token"``, ``fn`` cannot be called with its level's positional arguments
            (checked with ``inspect.signature(fn).bind``; ``*args`` accepts any),
            ``min_group_size`` not an integer >= 1, ``advised_group_size`` smaller than
            it, or ``name`` already registered and ``overwrite`` is False.
    """
    if fn is None:
        return lambda f: register_estimator(name, f, level=level, needs_values=needs_values,
                                            min_group_size=min_group_size, advised_group_size=advised_group_size,
                                            group_size_note=group_size_note, overwrite=overwrite)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(
            f"estimator name {name!r}; expected a letter followed by letters, digits, '_', "
            "'.' or '-'"
        )
    if not callable(fn):
        raise ConfigError(f"estimator {name!r}: {fn!r} is not callable")
    if level not in LEVELS:
        raise ConfigError(f"estimator {name!r}: level={level!r}; expected 'turn' or 'token'")
    _check_signature(name, fn, level)
    advised = min_group_size if advised_group_size is None else advised_group_size
    for key, value in (("min_group_size", min_group_size), ("advised_group_size", advised)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"estimator {name!r}: {key}={value!r}; expected an integer >= 1 "
                              "(rollouts per group it needs)")
    if advised < min_group_size:
        raise ConfigError(f"estimator {name!r}: advised_group_size={advised} is smaller than "
                          f"min_group_size={min_group_size}; expected advised_group_size >= min_group_size")
    with _lock:
        if name in ESTIMATORS and not overwrite:
            raise ConfigError(
                f"estimator {name!r} is already registered ({ESTIMATORS[name].fn!r}); pass "
                "overwrite=True to replace it"
            )
        ESTIMATORS[name] = Estimator(name, fn, level, bool(needs_values), min_group_size,  # type: ignore[arg-type]
                                     advised, str(group_size_note))
    return fn


def load_entry_points() -> None:
    """Load every ``agentrl.estimators`` entry point once per process: a module is
    imported (it registers), a callable is called. A broken one is logged, remembered
    (``get_estimator``'s unknown-name error names it and why) and skipped, so one bad
    package cannot stop training with the others.

    Loading happens under the registry lock and the process counts as loaded only once
    every entry point was tried, so a thread looking a name up meanwhile waits for it
    instead of seeing a half-filled registry.
    """
    global _entry_points_loaded, _entry_points_loading
    if _entry_points_loaded:
        return
    with _lock:
        if _entry_points_loaded or _entry_points_loading:  # loaded, or re-entered by an entry point
            return
        _entry_points_loading = True
        try:
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                try:
                    obj = ep.load()
                    if callable(obj):
                        obj()
                except Exception as exc:  # noqa: BLE001 - a user package; logged, remembered, skipped
                    _entry_point_failures[ep.name] = f"{ep.value}: {type(exc).__name__}: {exc}"
                    log.warning("estimator entry point %r (%s) failed: %s: %s", ep.name, ep.value,
                                type(exc).__name__, exc)
            _entry_points_loaded = True
        finally:
            _entry_points_loading = False


def estimator_names() -> list[str]:
    """The registered names, sorted (entry points loaded)."""
    load_entry_points()
    return sorted(ESTIMATORS)


def get_estimator(name: str) -> Estimator:
    """The registration of ``name`` (entry points loaded first).

    Raises:
        ConfigError: unknown name; the message lists the registered names, suggests the
            closest ones and names every ``agentrl.estimators`` entry point that failed to
            load, with its error.
    """
    load_entry_points()
    try:
        return ESTIMATORS[name]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(name), list(ESTIMATORS), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        failed = "".join(
            f"; entry point {ep!r} of {ENTRY_POINT_GROUP!r} failed to load ({why})"
            for ep, why in sorted(_entry_point_failures.items())
        )
        raise ConfigError(
            f"unknown advantage estimator {name!r}; {hint}registered: "
            f"{', '.join(repr(n) for n in sorted(ESTIMATORS))} (add one with critics.register_estimator in a "
            f"module listed in env.import_modules, or through the {ENTRY_POINT_GROUP!r} entry-point group)"
            f"{failed}"
        ) from None


# ---------------------------------------------------------------------------- built-ins


def _outcome(rewards, group_ids, *, norm_by_std: bool, leave_one_out: bool) -> list[list[float]]:
    """One group-relative advantage per episode (from its summed reward), on every turn."""
    adv = grpo_advantages([sum(r) for r in rewards], group_ids, norm_by_std=norm_by_std,
                          leave_one_out=leave_one_out)  # [N]
    return [[float(a)] * len(r) for a, r in zip(adv, rewards)]


def _grpo(rewards, anchors, group_ids, values, params: EstimatorParams):
    """GRPO (Shao et al. 2024): ``critics.grpo_advantages`` of the episode returns."""
    return _outcome(rewards, group_ids, norm_by_std=params.norm_by_std, leave_one_out=False)


def _rloo(rewards, anchors, group_ids, values, params: EstimatorParams):
    """RLOO (Ahmadian et al. 2024): leave-one-out mean baseline, no std."""
    return _outcome(rewards, group_ids, norm_by_std=False, leave_one_out=True)


def _drgrpo(rewards, anchors, group_ids, values, params: EstimatorParams):
    """Dr. GRPO (Liu et al. 2025): group mean baseline, no std."""
    return _outcome(rewards, group_ids, norm_by_std=False, leave_one_out=False)


def _gigpo(rewards, anchors, group_ids, values, params: EstimatorParams):
    """GiGPO (Feng et al. 2025): ``critics.gigpo_advantages`` with ``params.gamma`` and the
    ``params.gigpo_*`` settings (step weight, normalisation mode, episode statistics)."""
    return gigpo_advantages(rewards, anchors, group_ids, gamma=params.gamma, step_weight=params.gigpo_step_weight,
                            mode=params.gigpo_mode, episode_stats=params.gigpo_episode_stats)


def _turn_critic(rewards, anchors, group_ids, values, params: EstimatorParams):
    """Turn-level GAE (``critics.turn_critic_advantages``, ``gamma`` / ``lam`` per turn)."""
    return turn_critic_advantages(rewards, values, gamma=params.gamma, lam=params.lam)


def _gae(rewards, anchors, group_ids, values, turn_token_counts, params: EstimatorParams):
    """Token-level GAE (``critics.token_critic_advantages``, ``token_gamma`` / ``token_lam``)."""
    return token_critic_advantages(turn_token_counts, rewards, values, gamma=params.token_gamma,
                                   lam=params.token_lam)


_VS_GROUP = "its advantage compares the episode's return with the other rollouts of the same task instance"
register_estimator("grpo", _grpo, min_group_size=2, group_size_note=_VS_GROUP + ": Shao et al. 2024, §4.1.2")
register_estimator("rloo", _rloo, min_group_size=2, group_size_note=_VS_GROUP + ": their leave-one-out mean")
register_estimator("drgrpo", _drgrpo, min_group_size=2, group_size_note=_VS_GROUP + ": their mean")
register_estimator("gigpo", _gigpo, advised_group_size=2, group_size_note=(
    "the episode-level advantage (Feng et al. 2025, Eq. 3) is 0 in a group of one, and its step groups "
    "(Eq. 6-7) then hold only the visits of one trajectory, so only anchor states that trajectory revisits "
    "give a signal"))
register_estimator("turn_critic", _turn_critic, needs_values=True)
register_estimator("gae", _gae, level="token", needs_values=True)
