"""The judge phase on the run page and in the store: the stacked phase chart shows the
judge's tail (``time/judge_tail_s``) as a segment of its own carved out of the rollout, so
the stack still sums to the iteration's time; ``METRIC_KEYS`` reads it. A judgement's time
stamps travel with a pickled episode (Ray) but are not stored: a stored record reads None
and still equals the one written."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

from agentrl.replay import ReplayStore
from agentrl.replay.viewer.run_charts import METRIC_KEYS, PHASES, phase_seconds, run_charts
from agentrl.types import Episode, JudgeRecord, TerminationReason, Turn


def test_the_judge_tail_is_carved_out_of_the_rollout():
    metrics = {
        "time/rollout_s": [(1, 10.0), (2, 4.0), (3, 6.0)],
        "time/judge_tail_s": [(1, 2.5), (2, 5.0)],  # iteration 2: a tail longer than the rollout (async buffer)
        "time/judge_s": [(1, 9.0), (2, 9.0)],  # overlaps the rollout: never a segment
        "timeline/judge_start_s": [(3, 1.0)], "timeline/judge_end_s": [(3, 7.0)],  # no tail written: no segment
        "time/update_s": [(1, 3.0), (2, 3.0), (3, 3.0)],
    }
    ph = phase_seconds(metrics, [1, 2, 3])
    assert list(ph) == ["rollout", "judge", "update"]  # in the order of PHASES
    assert ph["rollout"] == [7.5, 0.0, 6.0] and ph["judge"][:2] == [2.5, 4.0] and math.isnan(ph["judge"][2])
    assert PHASES.index("judge") == PHASES.index("rollout") + 1
    bars = {c.chart_id: c for c in run_charts(metrics, str, is_async=False)}["phases"].bars
    assert [b.label.split(":")[1].split()[0] for b in bars[0]] == ["rollout", "judge", "update"]


def test_the_run_page_reads_the_judge_tail_and_no_judge_key_it_does_not_draw():
    assert "time/judge_tail_s" in METRIC_KEYS
    assert not {"time/judge_s", "timeline/judge_start_s", "timeline/judge_end_s"} & set(METRIC_KEYS)
    assert {"time/rollout_s", "timeline/rollout_start_s", "timeline/checkpoint_end_s"} <= set(METRIC_KEYS)


def _judged(eid: str) -> Episode:
    rec = JudgeRecord(model="m", rubric="r", rubric_digest="d" * 64, score=1.0, rule_reward=0.0, reward=1.0,
                      latency_s=0.5, calls=1, submitted_at_s=100.0, settled_at_s=103.5)
    turn = Turn([1, 2], [3, 4], [-0.5, -0.25], reward=1.0, action_text="42")
    return Episode(group_id="g", env_id="x/E-v0", task_id="t", seed=0, turns=[turn], terminated=True,
                   termination_reason=TerminationReason.ENV_TERMINATED, episode_id=eid, judgement=rec)


def test_the_stamps_travel_with_a_pickled_episode_but_are_not_stored(tmp_path: Path):
    ep = _judged("r/it1/g/0/a0")
    back = pickle.loads(pickle.dumps(ep))
    assert (back.judgement.submitted_at_s, back.judgement.settled_at_s) == (100.0, 103.5)
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        store.start_run("r", {})
        store.add_episodes("r", 1, [ep])
        stored = store.get_episode(ep.episode_id)
    assert stored.judgement == ep.judgement  # the stamps are left out of equality
    assert (stored.judgement.submitted_at_s, stored.judgement.settled_at_s) == (None, None)
