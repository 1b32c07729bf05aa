"""Fixtures for the trainer integration tests: a process group of one and tiny Llamas."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from agentrl.trainer import init_single_process_group
from agentrl.trainer.testing import make_tiny_llama


@pytest.fixture(scope="session")
def process_group() -> Iterator[None]:
    created = not dist.is_initialized()
    if created:
        init_single_process_group("gloo")
    yield
    if created and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), seed=0)
