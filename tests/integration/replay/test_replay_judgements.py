"""``Episode.judgement`` and the judge cache on both databases (SQLite, and PostgreSQL: see
conftest.py): a judged episode round-trips with its text (U+0000, non-ASCII) and JSON intact,
an unjudged one has no judgement, and the cache keeps the first answer of a key. The SQLite
details (replacement, old schemas) are in tests/unit/replay/test_judgements_store.py."""

from __future__ import annotations

import hashlib

from agentrl.replay import ReplayStore, read
from agentrl.types import JudgeRecord
from tests.integration.replay.conftest import MakeEpisode


def test_a_judged_episode_and_the_judge_cache_round_trip(store: ReplayStore, make_episode: MakeEpisode) -> None:
    digest = hashlib.sha256(b"rubric").hexdigest()
    record = JudgeRecord(
        model="judge-7b", rubric="helpful", rubric_digest=digest, mode="group",
        prompt=[{"role": "system", "content": "grade\x00it"}, {"role": "user", "content": "r\u00e9ponse: 42"}],
        output='{"correct": 1}\x00', scores={"correct": 1.0, "style": 0.25}, reasons={"": "ok", "style": "terse"},
        score=0.75, rule_reward=0.0, reward=0.75, latency_s=0.5, group_position=1,
    )
    store.start_run("r", {})
    judged, plain = make_episode(0, judgement=record), make_episode(1)
    store.add_episodes("r", 1, [judged, plain])
    assert store.get_episode(judged.episode_id) == judged
    assert store.get_episode(plain.episode_id).judgement is None
    assert read.episode_view(store.db, judged.episode_id).judgement.output == '{"correct": 1}\x00'

    keys = [hashlib.sha256(f"p{i}".encode()).hexdigest() for i in range(3)]
    store.judge_cache_put([(keys[0], "judge-7b", digest, "first\x00"), (keys[1], "judge-7b", digest, "b")])
    store.judge_cache_put([(keys[0], "judge-7b", digest, "second"), (keys[2], "judge-7b", digest, "c")])
    assert store.judge_cache_get(keys + ["0" * 64]) == {keys[0]: "first\x00", keys[1]: "b", keys[2]: "c"}
