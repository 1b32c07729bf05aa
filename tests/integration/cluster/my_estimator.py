"""A user's advantage estimator, registered when this module is imported (the acceptance
test names it in ``env.import_modules``): the episode's return minus the mean return of the
whole batch, on every turn. ``CALLS`` records what it was given and what it returned."""

from __future__ import annotations

import critics

CALLS: list[dict] = []


@critics.register_estimator("my_mean_baseline", level="turn", overwrite=True)
def my_mean_baseline(rewards, anchors, group_ids, values, params):
    """rewards ``[N][K_i]`` → ``[N][K_i]``: ``sum(rewards[i]) - mean_j sum(rewards[j])``."""
    totals = [sum(r) for r in rewards]
    mean = sum(totals) / len(totals)
    out = [[t - mean] * len(r) for t, r in zip(totals, rewards)]
    CALLS.append({"rewards": [list(r) for r in rewards], "group_ids": list(group_ids), "values": values,
                  "advantages": out})
    return out
