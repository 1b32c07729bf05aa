"""``train``'s start-up checks in the driver: settings that contradict the models are a
``ConfigError`` before Ray, an engine or a trainer actor starts (a trainer actor's
constructor error would only surface at its first call, after a whole rollout)."""

from __future__ import annotations

import json

import pytest

from agentrl.errors import ConfigError


def _hf_folder(path, vocab_size: int) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab_size}))
    return str(path)


def test_a_reference_with_another_vocabulary_stops_train_before_ray_starts(tmp_path) -> None:
    import ray

    from agentrl.driver.controller import train
    from agentrl.config import load_config

    policy = _hf_folder(tmp_path / "policy", 49152)
    other = _hf_folder(tmp_path / "other", 32000)
    run_dir = tmp_path / "run"
    cfg = load_config(None, [f"run.dir={run_dir}", f"model.path={policy}", "trainer.kl.coef=0.01",
                             f"trainer.kl.reference_path={other}", "sandbox.backend=bwrap"])
    assert not ray.is_initialized()
    with pytest.raises(ConfigError, match=r"reference_path=.*other' has vocab_size=32000 but the policy .* has vocab_size=49152"):
        train(cfg)
    assert not ray.is_initialized()  # refused in the driver, before any actor
    assert not (run_dir / "config.yaml").exists()  # and nothing written to the run directory
