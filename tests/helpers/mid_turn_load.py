"""A weight load in the middle of a turn, on a real engine: step a rollout session until the
engine request ``rid`` has sampled ``at_tokens`` ids, load weights in ``continue`` mode (the
request is preempted and goes on), then run the session dry."""

from __future__ import annotations

from typing import Any

from agentrl.rollout.session import WeightLoad


def load_mid_turn(session: Any, engine: Any, rid: str, at_tokens: int, *, max_steps: int = 2000,
                  wait_s: float = 0.05) -> tuple[list, WeightLoad, int]:
    """``(finished episodes, the load (its stats filled), ids the request had sampled)``.

    Raises:
        AssertionError: the request never sampled ``at_tokens`` ids within ``max_steps`` steps.
    """
    done: list = []
    for _ in range(max_steps):
        partial = engine._partial.get(rid)
        if partial is not None and len(partial.token_ids) >= at_tokens:
            break
        done += session.step_once(wait_s=wait_s)
    sampled = len(engine._partial[rid].token_ids)
    assert sampled >= at_tokens, (rid, sampled, at_tokens)
    load = WeightLoad(apply=lambda: (engine.reset_prefix_cache(), "prefix_reset")[1], policy_version=1,
                      mode="continue")
    session.request_load(load)
    while session.in_flight():
        done += session.step_once(wait_s=1.0)
    session.wait_closed()
    return done, load, sampled
