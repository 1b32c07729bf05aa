"""A reset that waits for what running episodes hold (an OpenEnv server's session slots, a
sandbox pool) never holds up the steps that would end those episodes and free it: resets run
in a thread pool of their own (``agentrl.rollout.session``). Seen with ``hub/OpenEnv-v0``: 128
eval episodes on a server of 16 sessions, 8 env threads all in resets waiting for a slot, the
16 episodes holding slots unable to step."""

from __future__ import annotations

import threading
import time

import gymnasium as gym

from agentrl.errors import EnvError
from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import EpisodeRequest, SamplingRecord, TerminationReason
from tests.unit.rollout.test_loop_batch_faults import STOP, AnswerEverything, CharTemplateTokenizer

SLOT_WAIT_S = 20.0


class SlotEnv(gym.Env):
    """Reset takes one of a server's ``slots`` (waiting up to ``SLOT_WAIT_S``), close gives it
    back; two steps end the episode."""

    def __init__(self, slots: threading.Semaphore, held: list[int]):
        self.slots, self.held, self.holding, self.t = slots, held, False, 0

    def reset(self, *, seed=None, options=None):
        if not self.slots.acquire(timeout=SLOT_WAIT_S):
            raise EnvError(f"no free slot within {SLOT_WAIT_S} s")
        self.holding, self.t = True, 0
        self.held.append(1)
        return "task", {}

    def step(self, action):
        self.t += 1
        return "obs", 1.0, self.t >= 2, False, {}

    def close(self):
        if self.holding:
            self.holding = False
            self.slots.release()


def test_episodes_waiting_for_a_slot_at_reset_do_not_starve_the_steps_that_free_one():
    slots, held = threading.Semaphore(2), []
    chat = ChatTokenizer(CharTemplateTokenizer(), (STOP,))
    worker = RolloutWorker(AnswerEverything(), chat, lambda req: (SlotEnv(slots, held), None),
                           RolloutLimits(max_turns=3, max_new_tokens=8, max_context_tokens=4096), SamplingRecord(),
                           env_workers=2)
    t0 = time.monotonic()
    episodes = worker.run([EpisodeRequest("x/Slots-v0", "t", 0, "g", 1, index=i) for i in range(8)], 0)
    assert [e.termination_reason for e in episodes] == [TerminationReason.ENV_TERMINATED] * 8, \
        [e.error for e in episodes]
    assert len(held) == 8 and time.monotonic() - t0 < SLOT_WAIT_S / 2
