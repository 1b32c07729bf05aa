"""The gateway adds no drift: the example agent (examples/openai_agent/shell_lookup_agent.py, written only
with the ``openai`` SDK) and the in-process ShellLookup env, on the same tasks and seeds with
the same real model (SmolLM2-135M-Instruct, float32, vLLM's CPU build) and real bubblewrap
sandboxes, give every turn the same prompt ids, sampled ids, behaviour log-probs and
rewards, so the same trainer rows.

Episodes run one at a time from an empty prefix cache, so every engine step samples one
sequence and the two runs' numerics cannot differ by batch composition or cached blocks
(a prefill over cached KV blocks differs from a fresh one in the last float bits).
"""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import pytest

from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import EpisodeRequest, SamplingRecord
from tests.integration.gateway.conftest import bwrap_env_factory

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "openai_agent" / "shell_lookup_agent.py"
TASKS = ["lookup/0"]  # the `note` family: the model calls bash, reads the note, acts


def _load_example():
    spec = importlib.util.spec_from_file_location("openai_agent_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def worker(smollm2_path):
    from transformers import AutoTokenizer

    from agentrl.rollout.engine import VLLMEngine

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    engine = VLLMEngine(smollm2_path, dtype="float32", max_model_len=4096, seed=0, max_num_seqs=4, kv_cache_gb=0.25,
                        decode=tok.decode)
    run_id = f"test-gw-{uuid.uuid4().hex[:8]}"
    factory = bwrap_env_factory(run_id)

    return RolloutWorker(engine, ChatTokenizer(tok, (2,)), factory,
                         RolloutLimits(max_turns=3, max_new_tokens=48, max_context_tokens=4096,
                                       stop_strings=("</tool_call>",)),
                         SamplingRecord(temperature=0.3), env_timeout_s=120)


def test_the_example_agent_trains_the_same_tokens_as_the_in_process_env(worker):
    example = _load_example()
    pairs = []
    for i, task in enumerate(TASKS):
        def req(env_id):
            return EpisodeRequest(env_id=env_id, task_id=task, seed=i, group_id=f"g{i}", sample_seed=100 + i)
        worker.engine.reset_prefix_cache()  # both runs start from the same engine state
        (a,) = worker.run([req("agentrl/ShellLookup-v1")], policy_version=0)
        worker.engine.reset_prefix_cache()
        (b,) = worker.run([req(example.ENV_ID)], policy_version=0)
        pairs.append((a, b))
    for a, b in pairs:
        assert a.error is None and b.error is None, (a.error, b.error)
        assert len(a.turns) == len(b.turns)
        for ta, tb in zip(a.turns, b.turns):
            assert ta.prompt_ids == tb.prompt_ids
            assert ta.completion_ids == tb.completion_ids
            assert ta.behavior_log_probs == tb.behavior_log_probs
            assert ta.reward == tb.reward
        assert [r.loss_mask() for r in a.rows()] == [r.loss_mask() for r in b.rows()]
        assert a.total_reward == b.total_reward
    # the comparison covers tool turns: a tool result went back through the agent
    assert all(len(a.turns) > 1 and a.turns[0].tool_calls for a, _ in pairs), [len(a.turns) for a, _ in pairs]
