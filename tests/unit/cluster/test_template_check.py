"""The start-up template check (``agentrl.cluster.actors.rollout_actor.check_chat_template``) guards the
prompt mode that needs it: full_history extends the prompt turn by turn (delta tokenization);
per_step renders each step's whole prompt, so a template that cannot be extended is allowed
there. The probe renders the environment's own tools where its class declares them."""

from __future__ import annotations

import copy

import pytest

from agentrl.cluster.actors.rollout_actor import PROBE_TOOLS, check_chat_template
from agentrl.config import config_from_dict
from agentrl.errors import TemplateError
from agentrl.rollout.chat import ChatTokenizer

# Shows only the last assistant message (as reasoning templates that strip earlier thoughts
# do): it cannot be extended turn by turn.
LAST_ASSISTANT_ONLY = (
    "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
    "{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}"
)


class _Recording(ChatTokenizer):
    """The real ChatTokenizer, recording the tools each check rendered."""

    def check_incremental(self, tools=None, system_prompt="You are a probe."):
        self.checked_tools = tools
        return super().check_incremental(tools=tools, system_prompt=system_prompt)


@pytest.fixture(scope="module")
def rewriting_chat(smollm2_tokenizer):
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = LAST_ASSISTANT_ONLY
    return _Recording(tok, (2,))


class NoToolsEnv:
    tools = ()


class BashEnv:
    tools = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
              "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]


class UndeclaredEnv:  # sets its tools per instance (as HumanEval does): the python probe
    pass


def test_full_history_refuses_a_template_that_cannot_be_extended(rewriting_chat):
    cfg = config_from_dict({"rollout": {"prompt_mode": "full_history"}})
    with pytest.raises(TemplateError, match="turn by turn"):
        check_chat_template(rewriting_chat, cfg, UndeclaredEnv)


def test_per_step_allows_a_template_that_cannot_be_extended(rewriting_chat):
    cfg = config_from_dict({"rollout": {"prompt_mode": "per_step"}})
    rewriting_chat.checked_tools = "not called"
    assert check_chat_template(rewriting_chat, cfg, UndeclaredEnv) is False
    assert rewriting_chat.checked_tools == "not called"


def test_check_template_false_skips_the_check(rewriting_chat):
    cfg = config_from_dict({"rollout": {"check_template": False}})
    assert check_chat_template(rewriting_chat, cfg, UndeclaredEnv) is False


@pytest.mark.parametrize("env_cls, expected", [
    (BashEnv, BashEnv.tools),
    (NoToolsEnv, None),
    (UndeclaredEnv, list(PROBE_TOOLS)),
])
def test_the_probe_renders_the_env_s_own_tools(smollm2_tokenizer, env_cls, expected):
    chat = _Recording(smollm2_tokenizer, (2, 0))
    assert check_chat_template(chat, config_from_dict({}), env_cls) is True
    assert chat.checked_tools == expected
