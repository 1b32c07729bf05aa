"""Weight loads with requests in flight on a real vLLM engine (asynchronous training loads weights mid-rollout): after
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
    """Ends after ``turns`` steps."""

    def __init__(self, turns: int = 1):
        self.turns, self.t = turns, 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return f"Task {options['task_id']}: write a long story about the number {seed}.", {}

    def step(self, action):
        self.t += 1
        return "go on", 1.0, self.t >= self.turns, False, {}


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


def roll_out_with_a_load(models, tokenizer, mode: str, max_turns: int = 1, stop_ids=(2,), max_new_tokens: int = 20):
    """Four episodes on the engine at the old weights; after 6 engine steps of sampling, a
    load of the new weights as version 1 in ``mode``; returns ``(episodes, load)``."""
    engine, old, new, old_weights, new_weights = models
    engine.update_weights(old_weights)
    worker = RolloutWorker(engine, ChatTokenizer(tokenizer, tuple(stop_ids)), lambda req: (OneTurnEnv(max_turns), None),
                           RolloutLimits(max_turns=max_turns, max_new_tokens=max_new_tokens, max_context_tokens=512),
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
        assert not done and engine.unfinished_ids()  # nothing finished yet, requests in flight
        load = WeightLoad(apply=lambda: engine.update_weights(new_weights), policy_version=1, mode=mode)
        session.request_load(load)
        while len(done) < 4:
            done += session.step_once(wait_s=1.0)
        session.wait_closed()
    finally:
        session.abort_all()
        session.shutdown()
    assert load.stats["prefix_reset_ok"] and load.stats["method"] == "in_place"
    assert sorted(e.episode_id for e in done) == sorted(r.episode_id for r in requests)
    return done, load


def version_gaps(models, episodes) -> dict[str, float]:
    """Max |engine - transformers| log-prob gaps over every sampled token: ``own`` against
    the weights its version names, ``other`` against the other weights (0 where a version
    sampled nothing)."""
    _, old, new, _, _ = models
    gaps = {"own": 0.0, "other_min": float("inf")}
    for ep in episodes:
        for turn in ep.turns:
            v = torch.tensor(turn.policy_versions)
            engine_lp = torch.tensor(turn.behavior_log_probs)
            lp = {0: hf_log_probs(old, _prefix(ep, turn), turn.completion_ids),
                  1: hf_log_probs(new, _prefix(ep, turn), turn.completion_ids)}
            for version in (0, 1):
                sel = v == version
                if sel.any():
                    gaps["own"] = max(gaps["own"], (engine_lp[sel] - lp[version][sel]).abs().max().item())
                    other = (engine_lp[sel] - lp[1 - version][sel]).abs().max().item()
                    gaps["other_min"] = min(gaps["other_min"], other)
    return gaps


def _prefix(ep, turn) -> list[int]:
    """The full-history stream before ``turn``'s completion."""
    out: list[int] = []
    for t in ep.turns:
        out += t.prompt_ids
        if t is turn:
            return out
        out += t.completion_ids
    raise AssertionError("turn not in episode")


def test_continue_mode_tokens_match_the_weights_that_sampled_them(models, tokenizer):
    done, load = roll_out_with_a_load(models, tokenizer, "continue")
    assert load.stats["preempted_requests"] == 4  # the tiny model never samples id 2 this early: all 4 were generating
    for ep in done:
        v = ep.turns[0].policy_versions
        k = v.count(0)
        assert k >= 6 and v == [0] * k + [1] * (len(v) - k) and len(v) > k  # both versions in one turn
    gaps = version_gaps(models, done)
    print(f"in-flight load (continue): max gaps {gaps}")
    assert gaps["own"] < TOL  # each token matches the weights that sampled it
    assert gaps["other_min"] > 10 * TOL  # and, in every turn and version, not the other weights


# one id in 20 stops a turn (the tiny random model rarely samples its real EOS): turns of ~20
# tokens that mostly end by "stop", so the episodes get to their second turn
SOME_STOP = (2,) + tuple(range(3, 49152, 20))


@pytest.mark.parametrize("mode", ["drain", "restart"])
def test_drain_and_restart_tokens_match_the_weights_that_sampled_them(models, tokenizer, mode):
    done, load = roll_out_with_a_load(models, tokenizer, mode, max_turns=2, stop_ids=SOME_STOP, max_new_tokens=60)
    versions = [sorted(set(t.policy_versions)) for ep in done for t in ep.turns]
    print(f"{mode}: turn versions {versions}, load {load.stats}")
    assert all(len(v) == 1 for v in versions)  # in both modes a turn never spans versions
    if mode == "drain":  # the turns in flight finished on the old weights, the later ones started on the new
        assert [0] in versions and [1] in versions and load.stats["restarted_episodes"] == 0
    else:  # every episode was in flight: abandoned and started again from reset under the new weights
        assert all(v == [1] for v in versions) and load.stats["restarted_episodes"] == 4
    assert load.stats["preempted_requests"] == 0
    gaps = version_gaps(models, done)
    print(f"in-flight load ({mode}): max gaps {gaps}")
    assert gaps["own"] < TOL and gaps["other_min"] > 10 * TOL


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
