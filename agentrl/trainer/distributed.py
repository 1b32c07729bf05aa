"""Process-group helpers for running ``PolicyTrainer`` without a launcher."""

from __future__ import annotations

import torch.distributed as dist

from agentrl.errors import ConfigError


def init_single_process_group(backend: str = "gloo") -> None:
    """Initialise the default process group as a group of one (rank 0, world size 1),
    for a single trainer process on one machine. Uses an in-memory store: no port, no
    environment variables.

    Args:
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one CUDA device).

    Raises:
        ConfigError: a default process group already exists.
    """
    if dist.is_initialized():
        raise ConfigError(
            f"a default process group already exists (world_size={dist.get_world_size()}); "
            "init_single_process_group would replace it"
        )
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
