"""Config loading and validation: every bad key or value is a ConfigError naming it."""

from pathlib import Path

import pytest

from agentrl.config import Config, load_config
from agentrl.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "humaneval.yaml"


def test_example_config_loads_with_documented_defaults():
    cfg = load_config(EXAMPLE)
    assert cfg.env.id == "agentrl/HumanEval-v0"
    assert (cfg.env.tasks_per_iteration, cfg.env.group_size, cfg.rollout.max_turns) == (4, 4, 3)
    assert cfg.model.dtype == "float32"


def test_overrides_apply_with_yaml_types():
    cfg = load_config(EXAMPLE, ["run.iterations=7", "rollout.temperature=0.6", "env.kwargs={max_tool_calls: 2}"])
    assert cfg.run.iterations == 7 and cfg.rollout.temperature == 0.6
    assert cfg.env.kwargs == {"max_tool_calls": 2}


@pytest.mark.parametrize(
    "override, needle",
    [
        ("run.iteratons=3", "unknown key 'run.iteratons'"),
        ("trainer.lr=-1", "trainer.lr=-1"),
        ("rollout.max_turns=zero", "rollout.max_turns='zero'"),
        ("nosuchsection.x=1", "unknown key 'nosuchsection'"),
        ("rollout.max_new_tokens=4096", "max_new_tokens=4096 must be smaller than rollout.max_context_tokens=2048"),
        ("rollout.top_p=0.9", "top_p=0.9"),
        ("algorithm.advantage=ppo", "algorithm.advantage='ppo'"),
        ("sandbox.backend=firecracker", "sandbox.backend='firecracker'"),
        ("run.iterations", "not of the form key.sub=value"),
    ],
)
def test_bad_values_name_the_key_and_value(override, needle):
    with pytest.raises(ConfigError) as exc:
        load_config(EXAMPLE, [override])
    assert needle in str(exc.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(bad)


def test_run_dir_defaults_under_output_dir():
    cfg = Config()
    assert cfg.run_dir() == Path("runs") / cfg.run.name
