"""Weight sync, proven: after an update is synced, vLLM's log-probs of a fixed sequence equal
the trainer's (fp32 engine and trainer, max abs gap < 1e-4), and before the sync they do not;
through ``agentrl.cluster.weight_sync.sync_weights`` to two engines, on the object-store path
and on the collective path (gloo on CPU: trainer rank 0 broadcasting to both engines over a
group of its own), with the engines loading in place (not vLLM's generic reload).
Also case C04's engine part: at equal weights, the engine's behavior_log_probs of sampled
tokens equal the trainer's recomputation at the sampling temperature, T in {0.6, 1.0, 1.5}."""

from __future__ import annotations

import pytest
import torch

from agentrl.types import SamplingRecord, TokenBatch, TokenSequence

pytestmark = pytest.mark.slow
TOL = 1e-4


@pytest.fixture(scope="module")
def actors(ray_session, tmp_path_factory, tiny_model_path):
    from agentrl.cluster.actors import RolloutActor
    from agentrl.cluster.trainer_group import TrainerGroup
    from agentrl.config import load_config

    cfg = load_config(None, [f"run.dir={tmp_path_factory.mktemp('ws')}", f"model.path={tiny_model_path}",
                             "trainer.lr=3e-3", "rollout.max_context_tokens=512", "rollout.max_new_tokens=16"])
    d = cfg.model_dump(mode="json")
    group = TrainerGroup(cfg, d, tiny_model_path, {"num_cpus": 1})
    rollout = RolloutActor.remote(d, tiny_model_path, "test-weight-sync")
    second = RolloutActor.remote(d, tiny_model_path, "test-weight-sync", engine_index=1)
    ray_session.get([rollout.ready.remote(), second.ready.remote()])
    group.ready()
    yield ray_session, group.actors[0], rollout, second
    ray_session.kill(rollout)
    ray_session.kill(second)
    group.kill()


def _batch(ids, lps=None, temperature=1.0, adv=1.0):
    mask = [0] + [1] * (len(ids) - 1)
    lps = lps if lps is not None else [-1.0] * (len(ids) - 1)
    row = TokenSequence(ids, mask, lps, [0.0] + [adv] * (len(ids) - 1), "g", 0, "e")
    return TokenBatch.pack([row], SamplingRecord(temperature=temperature))


def test_sync_makes_engine_match_trainer(actors):
    ray, trainer, rollout, _ = actors
    seq = [1, 4093, 198, 33, 3060, 314, 216, 34, 1225, 28, 216, 35, 47, 2]
    batch = _batch(seq)
    engine_before = torch.tensor(ray.get(rollout.prompt_log_probs.remote(seq)))
    trainer_before = ray.get(trainer.compute_log_probs.remote(batch))[1:]
    assert (engine_before - trainer_before).abs().max().item() < TOL  # equal weights, equal numbers

    ray.get(trainer.step.remote(_batch(seq, trainer_before.tolist(), adv=1.0)))
    trainer_after = ray.get(trainer.compute_log_probs.remote(batch))[1:]
    moved = (trainer_after - trainer_before).abs().max().item()
    assert moved > 100 * TOL  # the update is real
    stale = torch.tensor(ray.get(rollout.prompt_log_probs.remote(seq)))
    assert (stale - trainer_after).abs().max().item() > 10 * TOL  # engine has not seen it yet

    ref = ray.get(trainer.state_dict_ref.remote())
    ray.get(rollout.update_weights.remote(ref))
    synced = torch.tensor(ray.get(rollout.prompt_log_probs.remote(seq)))
    gap = (synced - trainer_after).abs().max().item()
    print(f"weight sync: update moved log-probs by up to {moved:.3e}; engine-trainer gap after sync {gap:.3e}")
    assert gap < TOL
    assert ray.get(rollout.last_weight_load.remote())["method"] == "in_place"


SEQ = [1, 4093, 198, 33, 3060, 314, 216, 34, 1225, 28, 216, 35, 47, 2]


def _step_and_sync(ray, trainer, engines, method):
    """One real update, then ``sync_weights``; returns (metrics, trainer's log-probs after,
    each engine's log-probs after)."""
    from agentrl.cluster.weight_sync import sync_weights

    batch = _batch(SEQ)
    before = ray.get(trainer.compute_log_probs.remote(batch))[1:]
    ray.get(trainer.step.remote(_batch(SEQ, before.tolist(), adv=1.0)))
    after = ray.get(trainer.compute_log_probs.remote(batch))[1:]
    assert (after - before).abs().max().item() > 100 * TOL  # the update is real
    stale = [torch.tensor(x) for x in ray.get([e.prompt_log_probs.remote(SEQ) for e in engines])]
    assert all((s - after).abs().max().item() > 10 * TOL for s in stale)  # not synced yet
    m = sync_weights([trainer], engines, method=method, timeout_s=60)
    synced = [torch.tensor(x) for x in ray.get([e.prompt_log_probs.remote(SEQ) for e in engines])]
    return m, after, synced


@pytest.mark.parametrize("method", ["object_store", "collective"])
def test_sync_weights_to_two_engines(actors, method):
    ray, trainer, first, second = actors
    engines = [first, second]
    m, after, synced = _step_and_sync(ray, trainer, engines, method)
    gaps = [(s - after).abs().max().item() for s in synced]
    print(f"{method}: gaps {gaps}, metrics {m}")
    assert max(gaps) < TOL
    assert {"sync/gather_s", "sync/engine_0_s", "sync/engine_1_s", "sync/total_s", "sync/mb"} <= set(m)
    assert m["sync/total_s"] >= max(m["sync/engine_0_s"], m["sync/engine_1_s"]) > 0
    assert [ray.get(e.last_weight_load.remote())["method"] for e in engines] == ["in_place", "in_place"]
    if method == "collective":
        assert "sync/group_setup_s" in m and m["sync/broadcast_s"] > 0
        m2, after2, synced2 = _step_and_sync(ray, trainer, engines, method)  # the group is kept
        assert "sync/group_setup_s" not in m2
        assert max((s - after2).abs().max().item() for s in synced2) < TOL
        m3, after3, synced3 = _step_and_sync(ray, trainer, [second], method)  # another set of engines: new group
        assert "sync/group_setup_s" in m3 and "sync/engine_1_s" not in m3
        assert (synced3[0] - after3).abs().max().item() < TOL
        from agentrl.cluster.weight_sync import sync_weights

        sync_weights([trainer], engines)  # both engines at the trainer's weights again (C04 needs equal weights)


def test_tied_embedding_is_sent_once(actors):
    ray, trainer, _, _ = actors
    layout, _, _ = ray.get(trainer.gather_weights.remote())
    names = [s.name for s in layout.slots]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert layout.nbytes == sum(s.nbytes for s in layout.slots)  # one dtype: no gaps


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.5])
def test_C04_engine_and_trainer_agree_at_sampling_temperature(actors, temperature):
    ray, trainer, rollout, _ = actors
    prompt = [1, 4093, 198, 33, 3060, 314]
    ids, lps = ray.get(rollout.sample.remote(prompt, temperature, 12, 1234))
    assert len(ids) == len(lps) > 0
    row = TokenSequence(prompt + ids, [0] * len(prompt) + [1] * len(ids), lps,
                        [0.0] * (len(prompt) + len(ids)), "g", 0, "e")
    batch = TokenBatch.pack([row], SamplingRecord(temperature=temperature))
    trainer_lp = ray.get(trainer.compute_log_probs.remote(batch))[len(prompt):]
    gap = (trainer_lp - torch.tensor(lps)).abs().max().item()
    assert gap < TOL, f"T={temperature}: engine vs trainer gap {gap}"
