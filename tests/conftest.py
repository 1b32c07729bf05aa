"""Shared fixtures: the real models (prepared once, cached) and vLLM's CPU settings."""

from __future__ import annotations

import os
import signal

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# A test run started in the background by a shell without job control (`cmd &` in a
# script, a CI runner's step) inherits SIGINT as *ignored*, and so does every program the
# tests spawn: then the C10 tests' SIGINT to a training run or a sandbox owner does nothing
# and they time out. A handler here (not SIG_IGN) makes exec'd children start with SIGINT
# at its default again, as from an interactive shell.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from agentrl.model_zoo import prepare_model

    return str(prepare_model("smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    from agentrl.model_zoo import prepare_model

    return str(prepare_model("tiny-random-smollm2"))


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture
def process_group():
    """A torch.distributed process group of one (gloo) for in-process trainer tests.

    Checked at every use, not once per session: an in-process vLLM engine destroys the
    default group when it shuts down, so a group created before the vLLM tests ran (the
    export tests sort before them) was gone for every later trainer test. The group is
    left in place afterwards (the process's exit ends it)."""
    import torch.distributed as dist

    from agentrl.trainer import init_single_process_group

    if not dist.is_initialized():
        init_single_process_group("gloo")
    yield


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory) -> str:
    """A tiny random Llama (vocab 256, no tokenizer) for trainer tests."""
    from tests.helpers.trainer import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), seed=0)
