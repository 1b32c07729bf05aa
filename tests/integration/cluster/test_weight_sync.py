"""Weight sync, proven: after an update is synced, vLLM's log-probs of a fixed sequence equal
the trainer's (fp32 engine and trainer, max abs gap < 1e-4), and before the sync they do not.
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
    from agentrl.cluster.actors import RolloutActor, TrainerActor
    from agentrl.cluster.controller import _free_port
    from agentrl.config import load_config

    cfg = load_config(None, [f"run.dir={tmp_path_factory.mktemp('ws')}", f"model.path={tiny_model_path}",
                             "trainer.lr=3e-3", "rollout.max_context_tokens=512", "rollout.max_new_tokens=16"])
    d = cfg.model_dump(mode="json")
    trainer = TrainerActor.remote(0, 1, _free_port(), d, tiny_model_path)
    rollout = RolloutActor.remote(d, tiny_model_path, "test-weight-sync")
    ray_session.get(rollout.ready.remote())
    yield ray_session, trainer, rollout
    ray_session.kill(rollout)
    ray_session.kill(trainer)


def _batch(ids, lps=None, temperature=1.0, adv=1.0):
    mask = [0] + [1] * (len(ids) - 1)
    lps = lps if lps is not None else [-1.0] * (len(ids) - 1)
    row = TokenSequence(ids, mask, lps, [0.0] + [adv] * (len(ids) - 1), "g", 0, "e")
    return TokenBatch.pack([row], SamplingRecord(temperature=temperature))


def test_sync_makes_engine_match_trainer(actors):
    ray, trainer, rollout = actors
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


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.5])
def test_C04_engine_and_trainer_agree_at_sampling_temperature(actors, temperature):
    ray, trainer, rollout = actors
    prompt = [1, 4093, 198, 33, 3060, 314]
    ids, lps = ray.get(rollout.sample.remote(prompt, temperature, 12, 1234))
    assert len(ids) == len(lps) > 0
    row = TokenSequence(prompt + ids, [0] * len(prompt) + [1] * len(ids), lps,
                        [0.0] * (len(prompt) + len(ids)), "g", 0, "e")
    batch = TokenBatch.pack([row], SamplingRecord(temperature=temperature))
    trainer_lp = ray.get(trainer.compute_log_probs.remote(batch))[len(prompt):]
    gap = (trainer_lp - torch.tensor(lps)).abs().max().item()
    assert gap < TOL, f"T={temperature}: engine vs trainer gap {gap}"
