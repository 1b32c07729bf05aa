"""The multi-turn agent loop on a real vLLM engine (tiny random model with SmolLM2's real
tokenizer and chat template): invariants 1-3, termination cases C07 and C08, and faults
that are not the model's (infra and reward errors)."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest

from agentrl.errors import ConfigError, RewardError, SandboxError
from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import EpisodeRequest
from agentrl.types import SamplingRecord, TerminationReason

pytestmark = pytest.mark.slow

# The tiny random model rarely samples <|im_end|>. Declaring many ids as stop ids makes its
# turns end by "stop" after a few tokens, so multi-turn paths are exercised for real.
HALF_STOP = (2,) + tuple(range(3, 25000))
ALL_STOP = (2, 0) + tuple(range(3, 49152))


class ToolEchoEnv(gym.Env):
    """Answers every action with a tool observation; ends after ``episode_len`` steps."""

    def __init__(self, episode_len=3, obs_text="result: ok", fail_at=None, fail_with=None):
        self.episode_len, self.obs_text, self.fail_at, self.fail_with = episode_len, obs_text, fail_at, fail_with
        self.steps = 0
        self.actions: list[str] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return f"Task {options['task_id']}: call the tool.", {"anchor": ("start",), "system_prompt": "You are a test agent."}

    def step(self, action):
        self.actions.append(action)
        self.steps += 1
        if self.fail_at == self.steps:
            raise self.fail_with
        done = self.steps >= self.episode_len
        return self.obs_text, float(done), done, False, {"anchor": ("step", self.steps), "observation_role": "tool"}


class RecordingEngine:
    """The real engine, plus a record of what it returned (a spy beside the real thing)."""

    def __init__(self, engine):
        self.engine, self.completions, self.adds = engine, {}, []

    def add(self, request_id, prompt_ids, **kw):
        self.adds.append((request_id, list(prompt_ids), kw))
        self.engine.add(request_id, prompt_ids, **kw)

    def has_unfinished(self):
        return self.engine.has_unfinished()

    def step(self):
        out = self.engine.step()
        for c in out:
            self.completions[c.request_id] = c
        return out

    def abort(self, ids):
        self.engine.abort(ids)


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    from agentrl.rollout.engine import VLLMEngine

    return VLLMEngine(tiny_model_path, dtype="float32", max_model_len=1024, seed=0, max_num_seqs=16,
                      kv_cache_gb=KV_CACHE_GB)


KV_CACHE_GB = 0.125  # a fraction of a GiB: VLLM_CPU_KVCACHE_SPACE alone would have made it 1 GiB


def test_the_kv_cache_has_the_configured_size_also_below_one_gib(engine, tiny_model_path):
    """``rollout.kv_cache_gb`` is honoured to the byte (``kv_cache_memory_bytes``): the
    engine's blocks hold exactly as many tokens as 0.125 GiB fit at the model's K and V size
    per token (fp32), not the 1 GiB ``VLLM_CPU_KVCACHE_SPACE`` rounds it up to."""
    import json
    from pathlib import Path

    c = json.loads((Path(tiny_model_path) / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    bytes_per_token = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * head_dim * 4  # K and V, fp32
    cache = engine.llm.llm_engine.vllm_config.cache_config
    assert cache.num_gpu_blocks * cache.block_size * bytes_per_token == int(KV_CACHE_GB * 2**30)


def test_the_engine_compiles_nothing_and_leaves_torch_compile_as_it_was(engine):
    """vLLM's sampler ``torch.compile``s the rank of each sampled log-prob (a C++ build at an
    engine's first step, seconds of CPU at every start); the engine runs it eagerly: its
    first steps (this module's first) compile no graph, and afterwards the process's
    ``torch.compile`` stance is the default again."""
    import torch
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    for i, n in enumerate((3, 5)):  # two batch shapes: a compiled helper would compile (again) for each
        for k in range(n):
            engine.add(f"nocompile-{i}-{k}", [1, 2, 3, 4 + k], sampling=SamplingRecord(temperature=1.0), max_tokens=4,
                       stop_token_ids=[0], seed=k)
        done = []
        while engine.has_unfinished():
            done += engine.step()
        assert len(done) == n and all(len(c.log_probs) == len(c.token_ids) > 0 for c in done)
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch._dynamo.eval_frame._stance.stance == "default"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def _worker(engine, tokenizer, envs, *, stop_ids=(2, 0), limits=RolloutLimits(3, 24, 1024), temperature=1.0):
    chat = ChatTokenizer(tokenizer, tuple(stop_ids))
    it = iter(envs)

    def factory(req):
        return next(it), None

    spy = RecordingEngine(engine)
    return RolloutWorker(spy, chat, factory, limits, SamplingRecord(temperature=temperature), env_workers=4), spy


def _requests(n):
    return [EpisodeRequest("test/Echo", f"t{i}", seed=i, group_id=f"g{i // 2}", sample_seed=100 + i, index=i % 2)
            for i in range(n)]


def test_multi_turn_stream_is_prompt_plus_sampled_plus_observation_ids(engine, tokenizer):
    envs = [ToolEchoEnv(episode_len=3) for _ in range(4)]
    worker, spy = _worker(engine, tokenizer, envs, stop_ids=HALF_STOP, limits=RolloutLimits(3, 16, 1024))
    episodes = worker.run(_requests(4), policy_version=7)
    assert len(episodes) == 4
    assert max(len(ep.turns) for ep in episodes) == 3  # multi-turn for real
    for ep in episodes:
        ep.validate()
        assert sum(ep.loss_mask()) == len(ep.behavior_log_probs())  # invariant 3
        for k, turn in enumerate(ep.turns):
            comp = spy.completions[f"{ep.episode_id}:{k}"]
            assert turn.completion_ids == list(comp.token_ids)  # exactly what the engine sampled
            assert turn.behavior_log_probs == list(comp.log_probs)
            assert turn.policy_version == 7
            # the engine was prompted with exactly the stream so far (token-in)
            rid, prompt, _ = next(a for a in spy.adds if a[0] == f"{ep.episode_id}:{k}")
            assert prompt == [t for tt in ep.turns[:k] for t in tt.prompt_ids + tt.completion_ids] + turn.prompt_ids
        if ep.turns[0].finish_reason == "length":
            assert ep.termination_reason == TerminationReason.LENGTH and ep.truncated and len(ep.turns) == 1


def test_C07_second_declared_stop_id_ends_the_turn_and_is_in_the_mask(engine, tokenizer):
    # Find the token the model samples first (greedy), then declare it as the *second* stop id.
    probe_env = ToolEchoEnv(episode_len=1)
    worker, spy = _worker(engine, tokenizer, [probe_env], limits=RolloutLimits(1, 4, 1024), temperature=1e-3)
    first = worker.run(_requests(1), 0)[0].turns[0].completion_ids[0]
    assert first not in (0, 2)
    env = ToolEchoEnv(episode_len=1)
    worker, spy = _worker(engine, tokenizer, [env], stop_ids=(2, first), limits=RolloutLimits(1, 16, 1024), temperature=1e-3)
    ep = worker.run(_requests(1), 0)[0]
    turn = ep.turns[0]
    assert turn.finish_reason == "stop"
    assert turn.completion_ids == [first]  # the stop token is kept, nothing after it
    assert ep.loss_mask()[-1] == 1 and sum(ep.loss_mask()) == 1
    assert ep.termination_reason == TerminationReason.ENV_TERMINATED and not ep.truncated


class InvalidUnlessStoppedEnv(ToolEchoEnv):
    """Marks every action invalid and penalises it (as a strict format check would)."""

    def step(self, action):
        self.actions.append(action)
        return "bad format", -1.0, False, False, {"invalid_action": True}


@pytest.mark.parametrize("score_truncated", [True, False])
def test_C08a_length_stop_truncates_and_is_not_a_format_failure(engine, tokenizer, score_truncated):
    env = InvalidUnlessStoppedEnv(episode_len=3)
    worker, _ = _worker(engine, tokenizer, [env], stop_ids=(2,), temperature=1e-3,
                        limits=RolloutLimits(3, 3, 1024, score_truncated=score_truncated))
    ep = worker.run(_requests(1), 0)[0]
    assert ep.turns[-1].finish_reason == "length"
    assert ep.truncated and not ep.terminated and ep.termination_reason == TerminationReason.LENGTH
    assert len(ep.turns) == 1  # the episode ends at that turn
    assert ep.turns[-1].invalid_action is False and ep.turns[-1].reward == 0.0  # no format penalty
    assert env.actions == ([ep.turns[-1].action_text] if score_truncated else [])


def test_C08b_observation_that_leaves_no_room_ends_with_context_limit_and_no_engine_call(engine, tokenizer):
    env = ToolEchoEnv(episode_len=3, obs_text="word " * 400)
    worker, spy = _worker(engine, tokenizer, [env], stop_ids=ALL_STOP, limits=RolloutLimits(3, 4, 300), temperature=1.0)
    ep = worker.run(_requests(1), 0)[0]
    assert ep.turns[0].finish_reason == "stop" and env.actions  # the observation did arrive
    assert ep.termination_reason == TerminationReason.CONTEXT_LIMIT and ep.truncated
    assert len(spy.adds) == 1  # no call that would overflow
    assert all(len(p) + kw["max_tokens"] <= 300 for _, p, kw in spy.adds)


@pytest.mark.parametrize("exc, reason", [(SandboxError("sandbox died"), TerminationReason.INFRA_ERROR),
                                         (RewardError("verifier crashed"), TerminationReason.REWARD_ERROR)])
def test_faults_are_flagged_never_scored(engine, tokenizer, exc, reason):
    envs = [ToolEchoEnv(episode_len=2, fail_at=1, fail_with=exc), ToolEchoEnv(episode_len=1)]
    worker, _ = _worker(engine, tokenizer, envs, stop_ids=ALL_STOP, limits=RolloutLimits(2, 4, 1024))
    bad, good = worker.run(_requests(2), 0)
    assert bad.termination_reason == reason and bad.is_error and bad.total_reward is None
    assert bad.error["type"] == type(exc).__name__ and str(exc) in bad.error["message"]
    assert good.termination_reason == TerminationReason.ENV_TERMINATED
    assert not good.is_error and good.total_reward == 1.0


class HangingEnv(ToolEchoEnv):
    """An env whose reset or first step blocks until ``release`` is set (a hung tool)."""

    def __init__(self, hang_in, release, **kw):
        super().__init__(**kw)
        self.hang_in, self.release, self.closed = hang_in, release, False

    def reset(self, *, seed=None, options=None):
        if self.hang_in == "reset":
            self.release.wait()
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.hang_in == "step":
            self.release.wait()
        return super().step(action)

    def close(self):
        self.closed = True


@pytest.mark.parametrize("hang_in", ["reset", "step"])
def test_an_env_call_past_env_timeout_s_ends_its_episode_as_infra_error_and_the_rest_go_on(engine, tokenizer, hang_in):
    import threading

    release = threading.Event()
    hung = HangingEnv(hang_in, release, episode_len=2)
    envs = {"t0": hung, "t1": ToolEchoEnv(episode_len=2), "t2": ToolEchoEnv(episode_len=1)}
    worker = RolloutWorker(RecordingEngine(engine), ChatTokenizer(tokenizer, tuple(ALL_STOP)),
                           lambda req: (envs[req.task_id], None), RolloutLimits(2, 4, 1024),
                           SamplingRecord(temperature=1.0), env_workers=4, env_timeout_s=1.0)
    try:
        t0 = time.monotonic()
        bad, good, good2 = worker.run(_requests(3), 0)
        assert time.monotonic() - t0 < 60
        assert bad.termination_reason == TerminationReason.INFRA_ERROR and bad.is_error and bad.total_reward is None
        assert bad.error["type"] == "EnvError"
        assert (f"test/Echo.{hang_in} of task 't0'" in bad.error["message"]
                and "did not return within rollout.env_timeout_s=1;" in bad.error["message"])
        assert len(bad.turns) == (0 if hang_in == "reset" else 1)
        assert not hung.closed  # never closed under the stuck call
        release.set()
        deadline = time.monotonic() + 10
        while not hung.closed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hung.closed  # closed once it returned
        assert [e.termination_reason for e in (good, good2)] == [TerminationReason.ENV_TERMINATED] * 2
        assert good.total_reward == good2.total_reward == 1.0
    finally:
        release.set()
    with pytest.raises(ConfigError, match="env_timeout_s=0"):
        RolloutWorker(engine, worker.chat, None, worker.limits, worker.sampling, env_timeout_s=0)


class PaysFor42Env(ToolEchoEnv):
    """A verifier that pays for "42" in the policy's own text; the tool prints ANSWER=42."""

    def step(self, action):
        self.actions.append(action)
        self.steps += 1
        if self.steps == 1:
            return "ANSWER=42", 0.0, False, False, {"observation_role": "tool"}
        return "", float("42" in action), True, False, {}


def test_C03_reward_sees_only_the_policys_text_and_masks_hide_observations(engine, tokenizer):
    env = PaysFor42Env()
    worker, _ = _worker(engine, tokenizer, [env], stop_ids=ALL_STOP, limits=RolloutLimits(3, 4, 1024))
    ep = worker.run(_requests(1), 0)[0]
    assert len(ep.turns) == 2 and ep.termination_reason == TerminationReason.ENV_TERMINATED
    assert all("42" not in a for a in env.actions)  # the actions are the policy's decoded text only
    assert ep.total_reward == 0.0
    # the tool's "42" is in the stream, but only under loss_mask 0
    ids, mask = ep.token_ids(), ep.loss_mask()
    masked_text = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert "ANSWER=42" in tokenizer.decode(ids) and "ANSWER=42" not in masked_text


def test_per_step_mode_keeps_context_flat_and_makes_one_row_per_step(engine, tokenizer, tmp_path):
    from agentrl.config import AlgorithmConfig
    from agentrl.credit import assign_credit
    from agentrl.replay import ReplayStore

    envs = [ToolEchoEnv(episode_len=5, obs_text="the room is dark") for _ in range(2)]
    worker, spy = _worker(engine, tokenizer, envs, stop_ids=ALL_STOP,
                          limits=RolloutLimits(5, 4, 1024, prompt_mode="per_step", history_length=1))
    episodes = worker.run(_requests(2), 0)
    for ep in episodes:
        ep.validate()
        assert ep.prompt_mode == "per_step" and len(ep.turns) == 5
        for k, turn in enumerate(ep.turns):
            _, prompt, _ = next(a for a in spy.adds if a[0] == f"{ep.episode_id}:{k}")
            assert prompt == turn.prompt_ids  # the engine saw exactly this step's own prompt
            text = tokenizer.decode(turn.prompt_ids)
            assert text.startswith("<|im_start|>system") and "Task t" in text
            if k:
                assert "Current observation (after step" in text and turn.anchor == ("step", k)
        # history_length=1: prompts from step 2 on have the same shape, so they stay flat
        lens = [len(t.prompt_ids) for t in ep.turns]
        assert max(lens[2:]) - min(lens[2:]) <= 2 * 4 + 4  # differ only by the 1-token actions shown
    # GRPO rewards [1, 1] in one group → advantage 0, but every step becomes its own row
    res = assign_credit(episodes, AlgorithmConfig(advantage="gigpo"), worker.sampling)
    assert res.batch.num_rows == 10 and res.batch.num_loss_tokens == sum(e.num_generated_tokens() for e in episodes)
    store = ReplayStore(f"sqlite:///{tmp_path / 'r.db'}")
    store.start_run("r", {})
    store.add_episodes("r", 0, episodes)
    back = store.get_episode(episodes[0].episode_id)
    assert back.prompt_mode == "per_step" and back.token_ids() == episodes[0].token_ids()


@pytest.mark.parametrize("engine_sees_stops", [True, False], ids=["engine_stops", "loop_cuts"])
def test_a_stop_string_ends_the_turn_at_the_token_that_completes_it_and_the_episode_goes_on(
        engine, tokenizer, engine_sees_stops):
    """``rollout.stop_strings`` (agentrl/rollout/stop_strings.py): the same request sampled
    again (same seed, alone in the engine) with a stop string taken from its first sampling's
    text ends at exactly the shortest prefix whose text holds it, as ``stop`` with no stop
    token; the environment acts on that prefix, the episode goes on (it would have ended at
    ``max_new_tokens``), and the next prompt starts with the template's end-of-message text.
    ``engine_stops``: the engine aborts the request itself within its steps; ``loop_cuts``: an
    engine that ignores stop strings (the spy drops them) is cut by the agent loop instead."""
    from agentrl.rollout.stop_strings import cut_at_stop

    def decode(ids):
        return tokenizer.decode(list(ids), skip_special_tokens=False)

    limits = RolloutLimits(3, 24, 1024)
    first_env = ToolEchoEnv(episode_len=2)
    worker, spy = _worker(engine, tokenizer, [first_env], limits=limits)
    (first,) = worker.run(_requests(1), policy_version=0)
    full = first.turns[0].completion_ids
    assert first.turns[0].finish_reason == "length" and len(full) == 24, "pick another sample_seed"
    stop = decode(full[8:10])
    assert stop.strip(), "pick another slice"
    k = cut_at_stop(full, decode, [stop])
    assert k is not None and 1 <= k <= 10

    env = ToolEchoEnv(episode_len=2)
    worker, spy = _worker(engine, tokenizer, [env], limits=RolloutLimits(3, 24, 1024, stop_strings=(stop,)))
    if not engine_sees_stops:
        real_add = spy.add
        spy.add = lambda rid, prompt, **kw: real_add(rid, prompt, **{a: b for a, b in kw.items() if a != "stop_strings"})
    saved = engine.decode
    engine.decode = decode
    try:
        (ep,) = worker.run(_requests(1), policy_version=0)
    finally:
        engine.decode = saved
    ep.validate()
    t0 = ep.turns[0]
    assert t0.completion_ids == full[:k] and t0.finish_reason == "stop"
    assert stop in decode(t0.completion_ids) and stop not in decode(t0.completion_ids[:-1])
    assert t0.behavior_log_probs == first.turns[0].behavior_log_probs[:k]
    assert env.actions[0] == tokenizer.decode(full[:k], skip_special_tokens=True)
    engine_ids = spy.completions[f"{ep.episode_id}:0"].token_ids
    assert len(engine_ids) == (k if engine_sees_stops else 24)  # who cut it
    # the episode went on: the observation follows the closed assistant message
    assert len(ep.turns) == 2
    assert ep.turns[1].prompt_ids == worker.chat.delta_ids([{"role": "tool", "content": "result: ok"}],
                                                           completion_ended_with_stop=False)
    assert sum(ep.loss_mask()) == len(ep.behavior_log_probs())  # the closing text is not the policy's


EXAMPLE = ({"role": "user", "content": "Task e: call the tool."}, {"role": "assistant", "content": "EXAMPLE-CALL"},
           {"role": "tool", "content": "EXAMPLE-RESULT"}, {"role": "assistant", "content": "EXAMPLE-DONE"})


class ExampleEnv(ToolEchoEnv):
    """ToolEchoEnv that shows a worked example before its task (``example_messages``)."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs, {**info, "example_messages": [dict(m) for m in EXAMPLE]}


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_example_turns_sit_between_the_system_prompt_and_the_task_in_every_prompt(engine, tokenizer, mode):
    envs = [ExampleEnv(episode_len=2) for _ in range(2)]
    worker, spy = _worker(engine, tokenizer, envs, stop_ids=ALL_STOP,
                          limits=RolloutLimits(2, 4, 1024, prompt_mode=mode, history_length=1))
    for ep in worker.run(_requests(2), 0):
        ep.validate()
        assert len(ep.turns) == 2
        first = tokenizer.decode(ep.turns[0].prompt_ids)
        assert first.startswith("<|im_start|>system\nYou are a test agent.<|im_end|>\n<|im_start|>user\nTask e:")
        assert first.index("EXAMPLE-DONE") < first.index(f"Task {ep.task_id}:")
        # the example's tokens are prompt tokens: no loss on them
        mask_text = tokenizer.decode([t for t, m in zip(ep.token_ids(), ep.loss_mask()) if m])
        assert "EXAMPLE" not in mask_text
        if mode == "per_step":  # each step's prompt is rebuilt, the example included
            assert "EXAMPLE-RESULT" in tokenizer.decode(ep.turns[1].prompt_ids)
        else:  # later turns extend the stream: the example is not repeated
            assert "EXAMPLE" not in tokenizer.decode(ep.turns[1].prompt_ids)
