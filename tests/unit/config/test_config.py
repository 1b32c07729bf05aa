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


def test_the_learning_example_differs_from_the_default_only_where_it_says():
    from agentrl.config import load_default_config

    learn = load_config(EXAMPLE.parent / "shell_lookup_learn.yaml").model_dump()
    default = load_default_config().model_dump()
    changed = {f"{section}.{key}" for section in default for key in default[section]
               if learn[section][key] != default[section][key]}
    assert changed == {"run.name", "run.iterations", "run.checkpoint_every", "trainer.lr", "eval.num_tasks", "env.kwargs"}
    # the env's tool budget below the turn cap: a call past it ends the episode and is graded
    assert learn["env"]["kwargs"] == {"max_tool_calls": 3} and learn["rollout"]["max_turns"] == 4


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


def test_gae_estimator_is_accepted_with_per_token_discount_defaults():
    cfg = load_config(EXAMPLE, ["algorithm.advantage=gae"])
    assert cfg.algorithm.advantage == "gae" and cfg.algorithm.uses_critic
    # per-token discount and lambda are their own fields, 1.0 as verl's token-level PPO;
    # the per-turn gamma (0.95) does not act per token
    assert (cfg.algorithm.token_gamma, cfg.algorithm.token_lam) == (1.0, 1.0)
    assert cfg.algorithm.gamma == 0.95
    cfg = load_config(EXAMPLE, ["algorithm.advantage=gae", "algorithm.token_gamma=0.999", "algorithm.token_lam=0.95",
                                "critic.value_clip=0.5"])
    assert (cfg.algorithm.token_gamma, cfg.algorithm.token_lam, cfg.critic.value_clip) == (0.999, 0.95, 0.5)
    assert load_config(EXAMPLE, ["algorithm.advantage=turn_critic"]).algorithm.uses_critic
    assert not load_config(EXAMPLE, ["algorithm.advantage=gigpo"]).algorithm.uses_critic


@pytest.mark.parametrize("override", ["algorithm.token_gamma=1.5", "algorithm.token_lam=-0.1"])
def test_token_gamma_and_lam_are_checked(override):
    with pytest.raises(ConfigError, match=override.replace(".", r"\.")):
        load_config(EXAMPLE, ["algorithm.advantage=gae", override])


def test_unknown_estimator_names_the_value_and_lists_gae():
    with pytest.raises(ConfigError) as exc:
        load_config(EXAMPLE, ["algorithm.advantage=ppo_token"])
    msg = str(exc.value)
    assert "algorithm.advantage='ppo_token'" in msg and "'gae'" in msg and "'turn_critic'" in msg
