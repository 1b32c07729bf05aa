"""The local judge pool (agentrl/cluster/actors/judge_pool.py) through real Ray and vLLM: one
engine of the tiny random model answers a real ``Rubric``'s requests, and every answer parses
with ``Rubric.parse`` (a random model writes no JSON by itself: guided decoding does it);
concurrent calls share engine steps; a model that does not resolve is a ``ConfigError`` before
any actor starts, one that fails to load a ``JudgeError`` at the start-up check naming the
engine, and the judge service then leaves no actor behind. Beside them, ``PoolJudge``'s routing
and error conversion over stand-in engine actors, ``bounded_schema`` and the ``json_schema``
argument of ``VLLMEngine.add`` (no vLLM engine started).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentrl.config import Config, load_config
from agentrl.errors import ConfigError, EngineError, JudgeError
from agentrl.rewards.rubric import Rubric
from agentrl.rewards.types import Judge, JudgeItem, JudgeReply, JudgeRequest

pytestmark = pytest.mark.slow

RUBRIC_DICT = {"name": "equivalence", "criteria": [
    {"name": "correct", "description": "The answer equals the reference, in any form.", "gate": True},
    {"name": "clear", "description": "The answer is stated plainly.", "weight": 1.0}]}
RUBRIC = Rubric.from_dict(RUBRIC_DICT)
MAX_TOKENS = 128
ITEMS = [JudgeItem(task=f"What is {k} + {k}?", reference=str(2 * k), answer=f"{2 * k if k % 2 else k} apples")
         for k in range(8)]


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance for this module (as tests/integration/rollout/test_stream_actor.py)."""
    import ray

    from agentrl.cluster.actors.ray_connect import LOCAL_SYSTEM_CONFIG

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}},
                 _system_config=LOCAL_SYSTEM_CONFIG)
    yield ray
    if started:
        ray.shutdown()


def pool_config(run_dir, model: str) -> Config:
    data = load_config(None, [f"run.dir={run_dir}", f"model.path={model}"]).model_dump(mode="json")
    data["reward"] = {"judge": {"kind": "pool", "model": model, "max_tokens": MAX_TOKENS, "max_context_tokens": 1024,
                                "kv_cache_gb": 0.25, "timeout_s": 60.0, "max_concurrency": 8},
                      "rubric": RUBRIC_DICT, "combine": "judge"}
    return Config.model_validate(data)


@pytest.fixture(scope="module")
def pool(local_ray, tiny_model_path, tmp_path_factory):
    from agentrl.cluster.actors.judge_pool import start_judge_pool, stop_judge_pool

    p = start_judge_pool(pool_config(tmp_path_factory.mktemp("judge_pool"), tiny_model_path))
    try:
        p.check()
        yield p
    finally:
        stop_judge_pool(p)


def test_guided_answers_always_parse_and_concurrent_calls_share_steps(pool, local_ray, tiny_model_path):
    assert isinstance(pool, Judge)
    engine = pool.engines[0]
    before = local_ray.get(engine.stats.remote())
    requests = [RUBRIC.request(item, tiny_model_path) for item in ITEMS]
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(requests)) as ex:
        replies = list(ex.map(pool.complete, requests))
    elapsed = time.monotonic() - t0
    after = local_ray.get(engine.stats.remote())
    for reply in replies:
        assert isinstance(reply, JudgeReply) and reply.model == tiny_model_path and not reply.cached
        judgement = RUBRIC.parse(reply.text)  # raises on anything but the schema's JSON
        assert set(judgement.scores) == {"correct", "clear"}
        obj = json.loads(reply.text)  # bare JSON, nothing around it
        assert len(obj["reason"]) <= MAX_TOKENS // 2  # bounded_schema: the string closes in time
    steps = after["steps"] - before["steps"]
    tokens = after["tokens"] - before["tokens"]
    assert after["requests"] - before["requests"] == len(requests)
    assert steps < tokens / 2, (steps, tokens)  # one step samples a token of many requests
    assert after["peak_in_flight"] >= 4 and after["in_flight"] == 0
    assert (pool.calls, pool.failures) == (len(requests), 0)
    print(f"8 judge calls: {elapsed:.1f} s, {tokens} tokens in {steps} engine steps")


def test_a_model_that_does_not_resolve_is_a_config_error_before_any_actor(local_ray, tmp_path):
    from agentrl.cluster.actors.judge_pool import start_judge_pool
    from agentrl.cluster.actors.judge_service import start_judge_service

    missing = str(tmp_path / "no-such-judge")
    cfg = pool_config(tmp_path, missing)
    for start in (start_judge_pool, lambda c: start_judge_service(c, "judge-pool-test", None)):
        with pytest.raises(ConfigError, match="no-such-judge"):
            start(cfg)


def test_a_model_that_fails_to_load_fails_the_start_up_check_naming_the_engine(local_ray, tmp_path):
    from agentrl.cluster.actors.judge_service import judge_service_name, start_judge_service

    broken = tmp_path / "broken-judge"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')  # resolves; no tokenizer, no weights
    cfg = pool_config(tmp_path, str(broken))
    with pytest.raises(JudgeError, match=r"judge engine 0 of the pool \('.*broken-judge'\) failed to start: "
                                         r"actor judge engine 0 .*could not start: \w+Error") as err:
        start_judge_service(cfg, "judge-pool-broken", None)
    assert len(str(err.value)) < 1500  # the constructor's error on one line, not Ray's whole traceback
    with pytest.raises(ValueError):  # the service was stopped (and its engines, its children, with it)
        local_ray.get_actor(judge_service_name("judge-pool-broken"))


def test_pool_judge_routes_to_the_least_loaded_engine_and_names_a_failed_one(local_ray):
    from agentrl.cluster.actors.judge_pool import PoolJudge

    @local_ray.remote(num_cpus=0, max_concurrency=8)
    class StandIn:
        def __init__(self, name: str, fail: bool) -> None:
            self.name, self.fail, self.seen = name, fail, 0

        def complete(self, request: JudgeRequest) -> JudgeReply:
            self.seen += 1
            if self.fail:
                raise JudgeError(f"judge engine {self.name} did not answer within 1 s")
            time.sleep(0.5)
            return JudgeReply(text="{}", model="stand-in", latency_s=0.5)

        def count(self) -> int:
            return self.seen

    request = RUBRIC.request(ITEMS[0], "stand-in")
    engines = [StandIn.remote("0", False), StandIn.remote("1", False)]
    judge = PoolJudge(engines, "stand-in", timeout_s=5.0)
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(judge.complete, [request] * 4))
    assert local_ray.get([e.count.remote() for e in engines]) == [2, 2]

    engines.append(StandIn.remote("0", True))
    failing = PoolJudge(engines[2:], "stand-in", timeout_s=5.0)
    with pytest.raises(JudgeError, match="judge engine 0 did not answer"):
        failing.complete(request)
    local_ray.kill(engines[1])
    dead = PoolJudge([engines[1]], "stand-in", timeout_s=5.0)
    died = r"judge engine 0 of the pool \('stand-in'\) failed: actor judge engine 0 .*died"
    with pytest.raises(JudgeError, match=died):
        dead.complete(request)
    assert (failing.failures, dead.failures) == (1, 1)
    for engine in (engines[0], engines[2]):
        local_ray.kill(engine)


def test_bounded_schema_caps_free_text_only():
    from agentrl.cluster.actors.judge_pool import bounded_schema

    single = bounded_schema(RUBRIC.schema(), 100)
    assert single["properties"]["reason"] == {"type": "string", "maxLength": 50}
    assert single["properties"]["scores"] == RUBRIC.schema()["properties"]["scores"]
    assert "maxLength" not in RUBRIC.schema()["properties"]["reason"]  # a copy
    g = bounded_schema({"type": "object", "properties": {"answers": {"type": "array", "maxItems": 4, "items": {
        "type": "object", "properties": {"reason": {"type": "string"}, "tag": {"type": "string", "enum": ["a"]}}}}}},
        100)
    item = g["properties"]["answers"]["items"]["properties"]
    assert item["reason"]["maxLength"] == 12 and "maxLength" not in item["tag"]


class _Recorder:
    def __init__(self) -> None:
        self.params = []

    def add_request(self, request_id, prompt, params) -> None:
        self.params.append(params)


def test_vllm_engine_add_passes_json_schema_as_structured_outputs():
    from agentrl.rollout.engine import VLLMEngine
    from agentrl.types import SamplingRecord

    eng = object.__new__(VLLMEngine)  # no vLLM engine behind it: add's request only
    eng.engine, eng.max_model_len, eng.decode, eng._partial, eng._stops = _Recorder(), 64, None, {}, {}
    schema = RUBRIC.schema()
    kwargs = dict(sampling=SamplingRecord(temperature=0.0), max_tokens=8, stop_token_ids=[2])
    with pytest.raises(EngineError, match="guided_decoding=True"):
        eng.add("r0", [1, 2, 3], json_schema=schema, **kwargs)
    eng.add("r1", [1, 2, 3], **kwargs)  # the rollout's calls: unconstrained
    eng.guided_decoding = True
    eng.add("r2", [1, 2, 3], json_schema=schema, **kwargs)
    plain, guided = eng.engine.params
    assert plain.structured_outputs is None
    assert guided.structured_outputs.json == schema
