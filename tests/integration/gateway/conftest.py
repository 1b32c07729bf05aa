"""The engine the gateway tests share: real vLLM (tiny random model, SmolLM2's tokenizer and
chat template), scripted to answer every call with ``CALL`` (tests/helpers/forced_tokens.py):
a ``bash`` call whose command holds ``</tool_call>`` inside its JSON string, then the
end-of-turn token. One engine for the package: starting one costs seconds of CI."""

from __future__ import annotations

import gymnasium
import pytest

import environments
from agentrl.cluster.actors.env_factory import env_sandbox_mounts
from agentrl.rollout.chat import ChatTokenizer
from sandboxes import SandboxSpec, make_sandbox
from tests.helpers.forced_tokens import ScriptedTokens

COMMAND = "grep -n '</tool_call>' notes.md"
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "' + COMMAND + '"}}\n</tool_call>'
STOP_IDS = (2, 0)  # <|im_end|>, <|endoftext|>


@pytest.fixture(scope="package")
def scripted(tiny_model_path):
    """``(engine, chat)``: the scripted engine and the chat tokenizer of its model."""
    from transformers import AutoTokenizer

    from agentrl.rollout.engine import VLLMEngine

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    ScriptedTokens.script = tuple(tok.encode(CALL, add_special_tokens=False)) + (2,)
    ScriptedTokens.end_id = 2
    engine = VLLMEngine(tiny_model_path, dtype="float32", max_model_len=4096, seed=0, max_num_seqs=8,
                        kv_cache_gb=0.125, logits_processors=[ScriptedTokens], decode=tok.decode)
    return engine, ChatTokenizer(tok, STOP_IDS)


def bwrap_env_factory(run_id: str, backend: str = "bwrap", execs: list | None = None):
    """The rollout's ``factory(request) -> (env, sandbox)``: each episode's env made with a
    fresh sandbox of ``backend`` labelled ``run_id``, with the read-only mounts its env class
    asks for (``env_sandbox_mounts``, as the run's ``EnvFactory`` adds them), every exec's
    result appended to ``execs`` when given (closed if the env cannot be made)."""
    def factory(req):
        mounts = env_sandbox_mounts(environments.env_class(req.env_id))
        sb = make_sandbox(backend, SandboxSpec(run_id=run_id, memory_mb=512, ro_mounts=mounts))
        if execs is not None:
            sb.add_listener(execs.append)
        try:
            return gymnasium.make(req.env_id, sandbox=sb, disable_env_checker=True), sb
        except BaseException:
            sb.close()
            raise

    return factory
