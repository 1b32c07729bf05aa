"""The streaming ``RolloutActor`` through real Ray and vLLM (tiny model, GuessNumber, no
sandbox): ``stream_start``, two groups submitted, a weight load with ``policy_version=1``
while they run (``continue``: in-flight requests preempted and continued on the new
weights), every episode collected with per-token versions that never go backwards, and
``stream_stop`` handing back the requests that had not finished."""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = pytest.mark.slow

GROUP = 4


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance for this module, shut down after it (the cluster tests' shared
    ``ray_session`` lives in tests/integration/cluster/conftest.py and serves that folder)."""
    import ray

    from agentrl.cluster.actors.ray_connect import LOCAL_SYSTEM_CONFIG

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}},
                 _system_config=LOCAL_SYSTEM_CONFIG)  # as agentrl's own local start: no idle prestarted workers
    yield ray
    if started:
        ray.shutdown()


def _requests(cfg, first_position: int, n_groups: int):
    from agentrl.cluster.actors.env_factory import env_task_ids
    from agentrl.tasks import TaskSource

    tasks = TaskSource(cfg.env.id, env_task_ids(cfg.env.id, cfg.env.split), 0, GROUP, run_id="stream-test")
    tasks.next_requests(first_position)  # skip: each call's groups are new task instances
    return tasks.next_requests(n_groups)


def _payload(ray, model_path: str) -> list:
    """New weights in the object store, as ``TrainerActor.state_dict_ref`` puts them."""
    from transformers import AutoModelForCausalLM

    from agentrl.cluster.engines.weight_sync import FlatBuffer

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.add_(0.2 * p.abs().mean() * torch.randn(p.shape, generator=gen))
    layout, buf = FlatBuffer().pack({k: v.contiguous() for k, v in model.state_dict().items()})
    return [ray.put((layout, buf.numpy().copy())), {}]


def test_stream_with_a_weight_load_in_flight(local_ray, tmp_path, tiny_model_path):
    from agentrl.cluster.actors.rollout_actor import RolloutActor
    from agentrl.config import load_config
    from agentrl.errors import ClusterError

    ray = local_ray
    cfg = load_config(None, [f"run.dir={tmp_path}", f"model.path={tiny_model_path}", "env.id=agentrl/GuessNumber-v0",
                             # turns long enough to be in flight when the load lands: the tiny model samples
                             # 32 tokens of 8 requests in well under the 0.5 s the test waits (only vLLM's
                             # first-step compile, gone since, made them last longer)
                             "rollout.max_turns=2", "rollout.max_new_tokens=192", "rollout.max_context_tokens=1024",
                             "rollout.kv_cache_gb=1", "rollout.max_num_seqs=16"])
    actor = RolloutActor.remote(cfg.model_dump(mode="json"), tiny_model_path, "stream-test")
    try:
        ray.get(actor.ready.remote())
        payload = _payload(ray, tiny_model_path)
        ray.get(actor.set_policy_version.remote(0))
        ray.get([actor.stream_start.remote(), actor.stream_start.remote()])  # idempotent
        groups = _requests(cfg, 0, 2)
        ray.get(actor.stream_submit.remote(groups[:GROUP]))
        ray.get(actor.stream_submit.remote(groups[GROUP:]))
        assert ray.get(actor.stream_in_flight.remote()) == 2 * GROUP
        with pytest.raises(ClusterError, match="while the rollout stream runs"):
            ray.get(actor.rollout.remote(groups[:1], 0))
        got = ray.get(actor.stream_collect.remote(0.5))  # let them sample under version 0
        ray.get(actor.update_weights.remote(payload, 1, "continue"))
        load = ray.get(actor.last_weight_load.remote())
        assert load["policy_version"] == 1 and load["prefix_reset_ok"] and load["preempted_requests"] > 0, load
        deadline = time.monotonic() + 300
        while len(got) < 2 * GROUP and time.monotonic() < deadline:
            got += ray.get(actor.stream_collect.remote(5.0))
        assert sorted(e.episode_id for e in got) == sorted(r.episode_id for r in groups)
        assert ray.get(actor.stream_in_flight.remote()) == 0
        spanning = 0
        for ep in got:
            ep.validate()  # per-token versions: one per sampled id, never decreasing within a turn
            flat = [v for t in ep.turns for v in t.policy_versions]
            assert flat == sorted(flat) and set(flat) <= {0, 1}
            spanning += any(0 in t.policy_versions and 1 in t.policy_versions for t in ep.turns)
        assert spanning >= 1  # a turn continued across the update
        assert any(ep.policy_version_range()[0] == 1 for ep in got) or spanning == len(got)

        late = _requests(cfg, 2, 1)
        ray.get(actor.stream_submit.remote(late))
        back = ray.get(actor.stream_stop.remote())
        assert sorted(r.episode_id for r in back) == sorted(r.episode_id for r in late)
        assert ray.get(actor.stream_in_flight.remote()) == 0
        episodes, _ = ray.get(actor.rollout.remote(late[:1], 1))  # the synchronous path works again
        assert episodes[0].turns and all(v == 1 for t in episodes[0].turns for v in t.policy_versions)
    finally:
        ray.kill(actor)
