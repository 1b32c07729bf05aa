"""Shared fixtures: the real models (prepared once, cached) and vLLM's CPU settings."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from agentrl.models import prepare_model

    return str(prepare_model("smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    from agentrl.models import prepare_model

    return str(prepare_model("tiny-random-smollm2"))


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)
