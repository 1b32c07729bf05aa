"""Weight loads with requests in flight on a real vLLM engine (issue 12, item 4): after
every load no KV block computed under the old weights is reused.

Requests run, new (perturbed) weights load between two engine steps (``continue`` mode:
preempt, load, reset the prefix cache, continue each request from its prompt + partial
tokens), the requests finish; then transformers recomputes every sampled token's log-prob
on the full sequence at the sampling temperature, with the OLD weights for the tokens
tagged version 0 and the NEW weights for those tagged 1, and the engine's
``behavior_log_probs`` must match the right version's (fp32, 1e-3 as in
tests/integration/test_models_vllm.py). Negative controls: the pre-load tokens do not
match the new weights, and a load that skips the prefix-cache reset does reuse stale
blocks, which the same check catches."""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest
import torch

from agentrl.errors import EngineError
from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.rollout.session import RolloutSession, WeightLoad
from agentrl.types import EpisodeRequest, SamplingRecord

pytestmark = pytest.mark.slow

TOL = 1e-3
TEMPERATURE = 0.8


class OneTurnEnv(gym.Env):
    def reset(self, *, seed=None, options=None):
        return f"Task {options['task_id']}: write a long story about the number {seed}.", {}

    def step(self, action):
        return "done", 1.0, True, False, {}


@pytest.fixture(scope="module")
def models(tiny_model_path):
    """``(engine, old HF model, new HF model, new weights)``; the new weights are the old
    ones perturbed, so every log-prob moves."""
    from transformers import AutoModelForCausalLM

    from agentrl.rollout.engine import VLLMEngine

    engine = VLLMEngine(tiny_model_path, dtype="float32", max_model_len=512, seed=0, max_num_seqs=8)
    old = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    new = copy.deepcopy(old)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in new.parameters():
            if p.dim() == 2:
                p.add_(0.5 * p.abs().mean() * torch.randn(p.shape, generator=gen))
    new_weights = {k: v.detach().clone().contiguous() for k, v in new.state_dict().items()}
    old_weights = {k: v.detach().clone().contiguous() for k, v in old.state_dict().items()}
    yield engine, old, new, old_weights, new_weights


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def hf_log_probs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """``[n]`` log-probs (nats) of ``completion`` after ``prompt`` at ``TEMPERATURE``."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def test_continue_mode_tokens_match_the_weights_that_sampled_them(models, tokenizer):
    engine, old, new, old_weights, new_weights = models
    engine.update_weights(old_weights)
    worker = RolloutWorker(engine, ChatTokenizer(tokenizer, (2,)), lambda req: (OneTurnEnv(), None),
                           RolloutLimits(max_turns=1, max_new_tokens=20, max_context_tokens=512),
                           SamplingRecord(temperature=TEMPERATURE), env_workers=2)
    session = RolloutSession(worker, 0)
    requests = [EpisodeRequest("t/One", f"t{i}", seed=i, group_id="g", sample_seed=50 + i, index=i) for i in range(4)]
    try:
        session.submit(requests)
        done = []
        while len(engine.unfinished_ids()) < 4:
            done += session.step_once(wait_s=1.0)
        for _ in range(6):  # every request samples a few tokens under the old weights
            done += session.step_once(wait_s=1.0)
        assert not done and len(engine.unfinished_ids()) == 4
        load = WeightLoad(apply=lambda: engine.update_weights(new_weights), policy_version=1, mode="continue")
        session.request_load(load)
        while len(done) < 4:
            done += session.step_once(wait_s=1.0)
        session.wait_closed()
    finally:
        session.abort_all()
        session.shutdown()
    assert load.stats["preempted_requests"] == 4 and load.stats["prefix_reset_ok"] and load.stats["method"] == "in_place"

    gaps = {"old": 0.0, "new": 0.0, "v0_vs_new": 0.0, "v1_vs_old": 0.0}
    for ep in done:
        turn = ep.turns[0]
        v = torch.tensor(turn.policy_versions)
        k = int((v == 0).sum())
        assert k >= 6 and (v[k:] == 1).all() and len(turn.completion_ids) > k  # both versions in one turn
        engine_lp = torch.tensor(turn.behavior_log_probs)
        lp_old = hf_log_probs(old, turn.prompt_ids, turn.completion_ids)
        lp_new = hf_log_probs(new, turn.prompt_ids, turn.completion_ids)
        gaps["old"] = max(gaps["old"], (engine_lp[:k] - lp_old[:k]).abs().max().item())
        gaps["new"] = max(gaps["new"], (engine_lp[k:] - lp_new[k:]).abs().max().item())
        gaps["v0_vs_new"] = max(gaps["v0_vs_new"], (engine_lp[:k] - lp_new[:k]).abs().max().item())
        gaps["v1_vs_old"] = max(gaps["v1_vs_old"], (engine_lp[k:] - lp_old[k:]).abs().max().item())
    print(f"in-flight load (continue): max gaps {gaps}")
    assert gaps["old"] < TOL and gaps["new"] < TOL  # each token matches the weights that sampled it
    assert gaps["v0_vs_new"] > 10 * TOL and gaps["v1_vs_old"] > 10 * TOL  # and not the other weights


def test_a_load_without_the_prefix_reset_would_reuse_stale_blocks_and_the_check_sees_it(models):
    """The negative control of the check above: blocks cached under weights A, weights B
    loaded in place WITHOUT a reset, the same prompt again: its sampled tokens do not match
    B (the cached prefix was A's). After the reset they do."""
    from agentrl.rollout.weight_load import load_in_place

    engine, old, new, old_weights, new_weights = models
    engine.update_weights(old_weights)
    block = engine.engine.vllm_config.cache_config.block_size
    prompt = torch.randint(3, 4000, (min(2 * block, 400) + 5,), generator=torch.Generator().manual_seed(3)).tolist()

    def sample(rid: str) -> tuple[list[int], list[float]]:
        engine.add(rid, prompt, sampling=SamplingRecord(temperature=TEMPERATURE), max_tokens=8, stop_token_ids=(2,),
                   seed=11)
        while engine.has_unfinished():
            for c in engine.step():
                if c.request_id == rid:
                    return list(c.token_ids), list(c.log_probs)
        raise AssertionError(rid)

    sample("warm")  # the prompt's full blocks are now cached under the old weights
    assert engine.llm.apply_model(lambda m: load_in_place(m, new_weights))[0] is None  # no reset
    ids, lps = sample("stale")
    stale_gap = (torch.tensor(lps) - hf_log_probs(new, prompt, ids)).abs().max().item()
    engine.reset_prefix_cache()  # nothing in flight: succeeds
    ids, lps = sample("fresh")
    fresh_gap = (torch.tensor(lps) - hf_log_probs(new, prompt, ids)).abs().max().item()
    print(f"block_size {block}, prompt {len(prompt)} tokens: stale-prefix gap {stale_gap:.3e}, after reset {fresh_gap:.3e}")
    assert stale_gap > 10 * TOL and fresh_gap < TOL


def test_a_load_with_a_request_in_flight_is_refused_not_ignored(models):
    engine, _, _, old_weights, _ = models
    engine.add("busy", [1, 2, 3, 4, 5], sampling=SamplingRecord(), max_tokens=50, stop_token_ids=(2,), seed=1)
    engine.step()
    try:
        with pytest.raises(EngineError, match="hold KV blocks.*busy"):
            engine.update_weights(old_weights)
    finally:
        engine.abort(["busy"])
    engine.reset_prefix_cache()  # with nothing in flight it succeeds
