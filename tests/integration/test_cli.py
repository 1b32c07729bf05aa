"""The `agentrl` command line: user mistakes end with one clear line and exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _agentrl(*args: str, timeout: float = 120, cwd: Path | str = REPO,
             pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, COLUMNS="200", TERM="dumb")  # help text unwrapped, whatever the caller's terminal
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("args, needle", [
    (["train", "run.iteratons=3"], "unknown key 'run.iteratons'"),
    (["train", "examples/humaneval.yaml", "trainer.lr=-1"], "trainer.lr=-1"),
    (["train", "no/such/file.yaml"], "does not exist"),
    (["train", "env.id=agentrl/NoSuchEnv-v0", "run.dir=/tmp/agentrl-cli-test-noenv"], "env.id='agentrl/NoSuchEnv-v0'"),
    (["train", "--resume", "/tmp/agentrl-no-such-run"], "not a run directory"),
    (["models", "prepare", "no-such-model"], "no-such-model"),
])
def test_user_mistakes_are_one_clear_line(args, needle):
    r = _agentrl(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def _commands(group, prefix=()):
    """``(name, command)`` of every leaf command under ``group`` (typer's click group)."""
    for name, cmd in sorted(group.commands.items()):
        if hasattr(cmd, "commands"):  # a group (typer 0.29 vendors its own click classes)
            yield from _commands(cmd, prefix + (name,))
        else:
            yield " ".join(prefix + (name,)), cmd


def test_every_option_of_every_command_has_help_text():
    import typer.main

    from agentrl.cli import app

    commands = dict(_commands(typer.main.get_command(app)))
    assert {"train", "models prepare", "sandbox build-image", "sandbox gc", "envs list", "envs check"} <= set(commands)
    missing = []
    for name, cmd in commands.items():
        if not (cmd.help or "").strip():
            missing.append(f"agentrl {name}: no command help")
        for param in cmd.params:
            if not (getattr(param, "help", None) or "").strip():
                missing.append(f"agentrl {name} {param.opts[0] if param.opts else param.name}: no help text")
    assert not missing, missing
    r = _agentrl("train", "--help")
    assert r.returncode == 0
    for opt in ("--resume", "--address", "--debug", "overrides"):
        assert opt in r.stdout.lower()


def test_envs_list_shows_ours_and_users_not_gymnasiums():
    r = _agentrl("envs", "list")
    assert r.returncode == 0, r.stderr
    for env_id in ("agentrl/HumanEval-v0", "agentrl/ShellTasks-v0", "agentrl/Sokoban-v0", "agentrl/GuessNumber-v0"):
        assert env_id in r.stdout
    for theirs in ("phys2d/", "tabular/", "CartPole"):
        assert theirs not in r.stdout
    mine = _agentrl("envs", "list", "--module", "custom_env", pythonpath=REPO / "examples")
    assert mine.returncode == 0, mine.stderr
    assert "example/Add-v0" in mine.stdout and "yours" in mine.stdout


def test_an_unknown_env_id_suggests_the_close_one():
    r = _agentrl("train", "env.id=agentrl/HumanEvl-v0", "run.dir=/tmp/agentrl-cli-test-typo")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "did you mean 'agentrl/HumanEval-v0'?" in " ".join(r.stderr.split())


def test_train_without_a_config_file_works_from_any_directory():
    """No config file: the embedded default is package data (read with importlib.resources),
    found whatever the working directory."""
    r = _agentrl("train", "run.iteratons=3", cwd="/")
    assert r.returncode == 2 and "did you mean 'run.iterations'?" in " ".join(r.stderr.split()), r.stderr


def test_envs_check_passes_a_builtin_and_names_the_problem_of_a_broken_one():
    ok = _agentrl("envs", "check", "agentrl/Sokoban-v0")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    missing = _agentrl("envs", "check", "agentrl/NoSuchEnv-v0")
    assert missing.returncode != 0 and "NoSuchEnv" in (missing.stdout + missing.stderr)


def test_envs_check_makes_an_env_without_a_sandbox_when_its_class_needs_none():
    r = _agentrl("envs", "check", "example/Add-v0", "--module", "custom_env", pythonpath=REPO / "examples")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "example/Add-v0: PASS" in r.stdout


def test_envs_check_of_an_agent_behind_the_gateway_checks_its_task_env_and_says_so():
    r = _agentrl("envs", "check", "examples/ShellLookupAgent-v0", "--module", "shell_lookup_agent",
                 pythonpath=REPO / "examples" / "openai_agent")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "agentrl/ShellLookup-v1: PASS" in r.stdout
    assert "is an agent behind the gateway over agentrl/ShellLookup-v1" in " ".join(r.stderr.split())


def test_envs_check_with_a_config_makes_the_env_as_the_run_does(tmp_path):
    """--config: the env id, env.kwargs and split of the run config (a bad kwarg there is the
    env's make problem, so the kwargs did reach it); an id that is not the config's is refused."""
    cfg = tmp_path / "guess.yaml"
    cfg.write_text("env:\n  id: agentrl/GuessNumber-v0\n  split: test\n  kwargs: {low: 1, high: 4, max_guesses: 2}\n")
    ok = _agentrl("envs", "check", "--config", str(cfg))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "agentrl/GuessNumber-v0: PASS" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("env:\n  id: agentrl/GuessNumber-v0\n  kwargs: {low: 1, high: 4, max_guesses: 0}\n")
    r = _agentrl("envs", "check", "--config", str(bad))
    assert r.returncode == 1 and "max_guesses" in r.stdout, r.stdout + r.stderr
    other = _agentrl("envs", "check", "agentrl/Sokoban-v0", "--config", str(cfg))
    assert other.returncode != 0
    assert "is not" in other.stderr and "env.id='agentrl/GuessNumber-v0'" in " ".join(other.stderr.split())


def _long_path(tmp_path: Path) -> Path:
    """A missing path of about 300 characters whose names hold rich markup look-alikes."""
    return tmp_path / ("a" * 90) / ("b[bold]" * 12) / ("c" * 90) / "run[/y]"


@pytest.mark.parametrize("args, needle", [
    (["diagnose", "{path}"], "does not exist"),
    (["export", "{path}", "{path}-out"], "is not a run directory"),
    (["view", "{path}"], "does not exist"),
    (["train", "{path}.yaml"], "does not exist"),
    (["eval", "{path}"], "does not exist"),  # no progress line before it
    (["tasks", "profile", "{path}"], "does not exist"),
])
def test_an_error_is_one_whole_line_in_a_narrow_pipe(tmp_path, args, needle):
    """Under COLUMNS=40 with stderr a pipe (not a terminal), an error naming a 300-character
    path is one line: not broken at the console's width, the path whole, brackets in it kept
    as written (not read as markup)."""

    path = _long_path(tmp_path)
    assert len(str(path)) > 300
    r = _cli_in_a_narrow_pipe(args, path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and needle in lines[0] and str(path) in lines[0], lines[0]



def _cli_in_a_narrow_pipe(args: list[str], path) -> subprocess.CompletedProcess:
    """``agentrl ARGS`` (``{path}`` filled in) with stdout/stderr piped, no TERM, COLUMNS=40."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("TERM", "COLUMNS")}
    env["COLUMNS"] = "40"
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *[a.format(path=path) for a in args]], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)

@pytest.mark.parametrize("args, needle", [
    (["eval", "--samples", "yyyy", "{path}"], "Invalid value for '--samples': Input should be a valid integer, "
                                             "unable to parse string as an integer (got 'yyyy'); see '"),
    (["tasks", "profile", "--samples", "0", "{path}"], "Invalid value for '--samples': Input should be greater "
                                                       "than or equal to 1 (got '0')"),
    (["eval", "--no-such-option", "{path}"], "No such option: --no-such-option"),
    (["eval"], "Missing argument 'MODEL_OR_RUN_OR_CHECKPOINT'"),
    (["no-such-command", "{path}"], "No such command 'no-such-command'"),
])
def test_a_usage_error_is_one_plain_line_naming_the_value(tmp_path, args, needle):
    """typer's own usage errors (a bad option value, an unknown option or command, a missing
    argument) read like the CLI's other errors: one plain line in a narrow pipe, exit 2, not a
    box broken at the console's width."""

    path = _long_path(tmp_path)
    r = _cli_in_a_narrow_pipe(args, path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert not any(c in r.stderr for c in "╭│╰")
    assert "--help'" in lines[0]
