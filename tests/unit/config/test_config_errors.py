"""Config error messages name the keys and values, suggest close names, never dump the
config; and the embedded default config ships inside the package, equal to the example."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import DEFAULT_CONFIG_RESOURCE, config_from_dict, default_config_text, load_config, load_default_config
from agentrl.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


def _error(data: dict, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigError) as exc:
        config_from_dict(data, overrides)
    return str(exc.value)


@pytest.mark.parametrize("data, expected", [
    ({"rollout": {"max_new_tokens": 3000, "temperature": 0.7}},
     "invalid config: rollout.max_new_tokens=3000 must be smaller than rollout.max_context_tokens=2048"),
    ({"rollout": {"top_p": 0.5}, "run": {"name": "x"}},
     "invalid config: rollout.top_p=0.5, rollout.top_k=-1: the trainer cannot recompute log-probs under "
     "top-p/top-k truncation; use top_p=1.0 and top_k=-1"),
    ({"trainer": {"backend": "nccl"}}, "invalid config: trainer.backend='nccl' needs trainer.device='cuda'"),
])
def test_a_cross_field_error_names_fields_and_values_without_dumping_the_config(data, expected):
    msg = _error(data)
    assert msg == expected
    assert "<config>" not in msg and "{" not in msg  # no section or config dict in the message


@pytest.mark.parametrize("override, expected", [
    ("run.iteratons=3", "unknown key 'run.iteratons'; did you mean 'run.iterations'?"),
    ("rolout.max_turns=2", "unknown key 'rolout'; did you mean 'rollout'?"),
    ("sandbox.pool=2", "unknown key 'sandbox.pool'; did you mean 'sandbox.pool_size'?"),
    ("run.xyz=1", "unknown key 'run.xyz'; section 'run' has: name, output_dir, dir, seed, iterations, checkpoint_every"),
])
def test_an_unknown_key_suggests_close_names(override, expected):
    assert _error({}, (override,)) == f"invalid config: {expected}"


def test_env_kwargs_take_any_key_and_a_field_error_keeps_key_and_value():
    assert config_from_dict({"env": {"kwargs": {"anything": 1}}}).env.kwargs == {"anything": 1}
    assert _error({"env": {"kwargs": 5}}) == "invalid config: env.kwargs=5: Input should be a valid dictionary"
    assert "x" * 300 not in _error({"run": {"name": "x" * 300}})  # long values are shortened


def test_the_default_config_is_package_data_equal_to_the_example():
    """One source of truth: ``agentrl train`` with no file reads the packaged copy;
    examples/shell_lookup.yaml is the same bytes."""
    import agentrl

    packaged = Path(agentrl.__file__).parent / DEFAULT_CONFIG_RESOURCE
    assert packaged.is_file()
    assert default_config_text() == packaged.read_text()
    assert (REPO / "examples" / "shell_lookup.yaml").read_text() == packaged.read_text()
    assert load_default_config() == load_config(REPO / "examples" / "shell_lookup.yaml")
    assert load_default_config(["run.iterations=9"]).run.iterations == 9
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'agentrl = ["defaults/*.yaml"]' in pyproject  # shipped in the wheel
