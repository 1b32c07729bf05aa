"""Harbor task folders read without harbor (agentrl/hubs/harbor_task.py): task.toml's settings
and refusals, the network a task's container gets, the verifier's reward files, the task set
and its splits (the task folders of tests/helpers/harbor_tasks)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agentrl.errors import ConfigError, InfraError
from agentrl.hubs.harbor_task import (
    HarborError,
    TaskConfig,
    TaskSet,
    container_network,
    load_task,
    parse_reward,
    parse_task_config,
)

TASKS = Path(__file__).resolve().parents[2] / "helpers" / "harbor_tasks"


def test_defaults_are_harbors():
    c = parse_task_config('version = "1.0"\n[metadata]\nauthor_name = "x"\n')
    assert (c.agent_timeout_s, c.verifier_timeout_s, c.build_timeout_s) == (600.0, 600.0, 600.0)
    assert c.network == "public" and c.cpus is None and c.memory_mb is None and c.docker_image is None
    assert c.verifier_env == {} and c.solution_env == {}


def test_the_keys_read():
    c = parse_task_config("""
schema_version = "1.3"
[task]
name = "org/x"
[agent]
timeout_sec = 90
user = "agent"
[verifier]
timeout_sec = 12.5
env = { API = "k", MODE = "strict" }
[solution]
env = { S = "1" }
[environment]
build_timeout_sec = 30
docker_image = "my/env:1"
cpus = 2
memory = "4G"
storage_mb = 10240
allow_internet = false
""")
    assert c == TaskConfig(agent_timeout_s=90.0, verifier_timeout_s=12.5, build_timeout_s=30.0, network="no-network",
                           cpus=2.0, memory_mb=4096, docker_image="my/env:1", verifier_env={"API": "k", "MODE": "strict"},
                           solution_env={"S": "1"})
    assert parse_task_config("[environment]\nmemory_mb = 512\nmemory = '9G'\n").memory_mb == 512  # memory_mb wins
    assert parse_task_config("[environment]\nmemory = '512M'\n").memory_mb == 512
    c = parse_task_config('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n'
                          'allow_internet = false\n[agent]\nnetwork_mode = "allowlist"\n')
    assert (c.network, c.allowed_hosts) == ("allowlist", ("pypi.org",))  # network_mode wins over allow_internet


@pytest.mark.parametrize("text, named", [
    ("[agent]\ntimeout_sec = -1\n", "timeout_sec=-1"),
    ("[verifier]\ntimeout_sec = 'soon'\n", "timeout_sec='soon'"),
    ("[environment]\nbuild_timeout_sec = true\n", "build_timeout_sec=True"),
    ("[environment]\ncpus = 0\n", "cpus=0"),
    ("[environment]\nmemory = 'lots'\n", "memory='lots'"),
    ("[environment]\nmemory_mb = 8\n", "memory_mb=8"),
    ("[environment]\nnetwork_mode = 'some'\n", "network_mode='some'"),
    ("[environment]\nallow_internet = 'yes'\n", "allow_internet='yes'"),
    ("[environment]\ngpus = 1\n", "gpus=1"),
    ("[environment]\nos = 'windows'\n", "os='windows'"),
    ("[environment]\nnetwork_mode = 'no-network'\n[verifier]\nnetwork_mode = 'public'\n", "[verifier] network_mode='public'"),
    ("[verifier]\nenv = { A = 1 }\n", "env={'A': 1}"),
    ("[verifier.environment]\ncpus = 1\n", "[verifier.environment]"),
    ("agent = 3\n", "[agent] is a int"),
    ("[agent\n", "not valid TOML"),
])
def test_bad_values_are_infrastructure_errors_naming_them(text, named):
    with pytest.raises(HarborError, match="task.toml") as info:
        parse_task_config(text)
    assert named in str(info.value) and isinstance(info.value, InfraError)


def test_the_network_of_a_tasks_container():
    assert container_network(TaskConfig(network="no-network"), "task") == "none"
    assert container_network(TaskConfig(network="public"), "task") == "bridge"
    assert container_network(TaskConfig(network="public"), "none") == "none"
    assert container_network(TaskConfig(network="allowlist", allowed_hosts=("a.org",)), "none") == "none"
    with pytest.raises(HarborError, match=r"\['a.org'\].*cannot enforce"):
        container_network(TaskConfig(network="allowlist", allowed_hosts=("a.org",)), "task", "t")


@pytest.mark.parametrize("txt, js, expected", [
    ("1\n", None, (1.0, {"reward": 1.0})),
    (" 0.25 ", '{"reward": 1}', (0.25, {"reward": 0.25})),  # reward.txt first, as Harbor reads them
    (None, '{"reward": 1, "quality": 0.5}', (1.0, {"reward": 1.0, "quality": 0.5})),
    (None, '{"pass_rate": 0.75}', (0.75, {"pass_rate": 0.75})),
    (None, '{"reward": -2}', (-2.0, {"reward": -2.0})),
])
def test_reward_files(txt, js, expected):
    assert parse_reward(txt, js) == expected


@pytest.mark.parametrize("txt, js, named", [
    ("abc", None, "reward.txt holds 'abc'"),
    ("nan", None, "reward.txt holds 'nan'"),
    ("", None, "reward.txt holds ''"),
    (None, "[1]", "reward.json holds '[1]'"),
    (None, "{}", "reward.json holds '{}'"),
    (None, '{"reward": true}', "reward.json holds '{\"reward\": true}'"),
    (None, '{"reward": "1"}', "reward.json holds"),
    (None, "not json", "reward.json holds 'not json'"),
    (None, '{"a": 1, "b": 0}', "keys ['a', 'b'] and no 'reward'"),
    (None, None, "neither /logs/verifier/reward.txt nor reward.json"),
])
def test_bad_reward_files_are_errors_naming_the_value(txt, js, named):
    with pytest.raises(HarborError) as info:
        parse_reward(txt, js, "t1")
    assert named in str(info.value) and "'t1'" in str(info.value)


def test_the_task_set_of_the_test_tasks():
    tasks = TaskSet.from_path(TASKS)
    assert tasks.task_ids == ("hanging-verifier", "hello-file", "public-network")
    for split in ("train", "test", "all"):
        assert tasks.ids(split) == list(tasks.task_ids)
    with pytest.raises(ConfigError, match="split='valid' is not one of"):
        tasks.ids("valid")
    with pytest.raises(ConfigError, match="task_id='nope' is not a task"):
        tasks.task_dir("nope")
    one = TaskSet.from_path(TASKS / "hello-file")
    assert one.task_ids == ("hello-file",) and one.task_dir("hello-file") == TASKS / "hello-file"
    task = load_task(TASKS / "hello-file")
    assert task.task_id == "hello-file" and "/app/greeting.txt" in task.instruction
    assert task.config.network == "no-network" and task.config.verifier_env == {"GREETING": "hello"}
    assert load_task(TASKS / "hanging-verifier").config.verifier_timeout_s == 2.0


def test_splits_json_and_bad_paths(tmp_path):
    for name in ("a", "b", "c"):
        shutil.copytree(TASKS / "hello-file", tmp_path / name)
    (tmp_path / "not-a-task").mkdir()
    (tmp_path / "splits.json").write_text(json.dumps({"train": ["b", "a"], "test": ["c"]}))
    tasks = TaskSet.from_path(tmp_path)
    assert (tasks.ids("train"), tasks.ids("test"), tasks.ids("all")) == (["a", "b"], ["c"], ["a", "b", "c"])
    assert tasks.split_of("c") == "test"
    (tmp_path / "splits.json").write_text(json.dumps({"train": ["a", "zz"]}))
    with pytest.raises(ConfigError, match=r"names \['zz'\]"):
        TaskSet.from_path(tmp_path)
    (tmp_path / "splits.json").write_text(json.dumps({"all": ["a"]}))
    with pytest.raises(ConfigError, match="split 'all' is every task"):
        TaskSet.from_path(tmp_path)
    with pytest.raises(ConfigError, match="is not a folder"):
        TaskSet.from_path(tmp_path / "missing")
    with pytest.raises(ConfigError, match="holds no Harbor task"):
        TaskSet.from_path(tmp_path / "not-a-task")
    with pytest.raises(ConfigError, match="path=None"):
        TaskSet.from_path(None)


def test_a_task_folder_missing_what_it_needs(tmp_path):
    task = tmp_path / "t"
    shutil.copytree(TASKS / "hello-file", task)
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(HarborError, match="no tests/test.sh"):
        load_task(task)
    shutil.copy(TASKS / "hello-file" / "tests" / "test.sh", task / "tests" / "test.sh")
    (task / "environment" / "Dockerfile").unlink()
    with pytest.raises(HarborError, match="no environment/Dockerfile"):
        load_task(task)
    (task / "task.toml").write_text('[environment]\ndocker_image = "mine:1"\n')
    assert load_task(task).config.docker_image == "mine:1"
    (task / "steps").mkdir()
    with pytest.raises(HarborError, match="multi-step"):
        load_task(task)
    (task / "steps").rmdir()
    (task / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(HarborError, match="several containers"):
        load_task(task)
    (task / "instruction.md").unlink()
    with pytest.raises(HarborError, match="instruction.md"):
        load_task(task)
