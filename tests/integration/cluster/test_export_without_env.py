"""``agentrl export`` of a run whose environment code is not importable here (its
``env.import_modules`` module and the estimator that module registers are missing): the
weights export and pass the round-trip check all the same, and every exported file has the
mode a new file gets under the process's umask (safetensors alone leaves the weights 0600).
A real trainer checkpoint of the tiny random SmolLM2, no Ray, no engine; the whole command
on a trained run is ``test_export.py``."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.usefixtures("process_group")

MISSING_MODULE = "calc_env_not_installed_here"
MISSING_ESTIMATOR = "calc_step_advantage"


def _run_without_its_env(tmp_path: Path, model_path: str) -> Path:
    """A run directory as `agentrl train` writes it (config.yaml from a validated config,
    checkpoints/iter_1 with a real trainer checkpoint, checkpoints/latest) whose config
    names an env module and an estimator that do not exist on this machine."""
    from agentrl.config import load_default_config
    from agentrl.trainer import PolicyTrainer, TrainerConfig

    data = load_default_config([f"model.path={model_path}", "model.dtype=float32"]).model_dump(mode="json")
    data["env"].update(id="calc/Calc-v0", import_modules=[MISSING_MODULE])
    data["algorithm"]["advantage"] = MISSING_ESTIMATOR
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "iter_1"
    ckpt.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    trainer = PolicyTrainer(TrainerConfig(model_path=model_path))
    trainer.save_checkpoint(ckpt / "trainer")
    del trainer
    (ckpt / "controller.json").write_text(json.dumps({"run_id": "calc", "iteration": 1, "policy_version": 1}))
    (run / "checkpoints" / "latest").write_text("iter_1")
    return run


def test_export_needs_neither_the_env_module_nor_its_estimator_and_files_follow_the_umask(tmp_path, tiny_model_path):
    from agentrl.driver.checkpoint import RunDir
    from agentrl.commands.export import export_config, export_run, prepare_export
    from agentrl.errors import ConfigError

    run = _run_without_its_env(tmp_path, tiny_model_path)
    with pytest.raises(ConfigError, match=MISSING_MODULE):  # what a full load of the run's config needs
        RunDir(run).load_config([])
    cfg = export_config(run)
    assert cfg.model.path == tiny_model_path and cfg.env.import_modules == [] and cfg.algorithm.advantage == "grpo"

    out = tmp_path / "hf"
    old = os.umask(0o027)  # not the usual 022: the modes must follow the umask, not a fixed 0644
    try:
        report = export_run(prepare_export(run, out))
    finally:
        os.umask(old)
    assert MISSING_MODULE not in sys.modules
    assert report.max_abs_diff <= 1e-6 and report.tokens > 0 and report.run_id == "calc"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "agentrl_export.json"} <= set(modes)
    assert modes == dict.fromkeys(modes, 0o640), {k: oct(v) for k, v in modes.items()}


def test_a_broken_config_yaml_is_a_clear_error(tmp_path):
    from agentrl.commands.export import export_config
    from agentrl.errors import ConfigError

    (tmp_path / "config.yaml").write_text("model:\n  dtype: float7\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: .*model\.dtype"):
        export_config(tmp_path)
    (tmp_path / "config.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match="not a mapping"):
        export_config(tmp_path)
