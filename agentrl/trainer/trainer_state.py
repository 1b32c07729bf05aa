"""Weights and checkpoint state of ``PolicyTrainer``: the full (unsharded) state dict for
the weight sync, the sharded checkpoint with optimizer, scheduler and RNG states, and the
Hugging Face folder written for users and engines that load from disk.

``PolicyStateMixin`` holds these methods; the class that uses it provides ``model`` (the
FSDP2-wrapped HF model), ``rank``, ``world_size``, ``config`` (with ``model_path``) and
``_core`` (its ``agentrl.trainer._core.TrainerCore``).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from agentrl.trainer import _fsdp_common as fc
from agentrl.trainer import export as hf_export
from agentrl.trainer._core import TrainerCore
from agentrl.trainer.config import TrainerConfig


class PolicyStateMixin:
    """The state methods of ``PolicyTrainer`` (see the module docstring for what the class
    that uses it provides). Every method is collective: call it on every rank."""

    model: torch.nn.Module
    rank: int
    world_size: int
    config: TrainerConfig
    _core: TrainerCore

    def full_state_dict(
        self, dtype: torch.dtype | None = None, *, copy: bool = True, tied_copies: bool = True
    ) -> dict[str, torch.Tensor]:
        """The full (unsharded) model weights with HF parameter names, on CPU.

        What vLLM's ``reload_weights`` takes (platform-notes.md). Collective: every rank
        must call it; rank 0 gets the dict, other ranks get ``{}``.

        Args:
            dtype: cast floating-point tensors to this dtype (e.g. ``torch.bfloat16`` for a
                bf16 engine; note the precision warning in platform-notes.md); ``None``
                keeps fp32.
            copy: ``True``: no tensor shares memory with the live parameters. ``False``: on
                one CPU rank (where the gathered tensors are the parameters themselves) the
                live tensors are returned uncopied, valid until the next ``step``; for a
                caller that copies them at once (the weight sync, which packs them into one
                buffer) and so saves a copy of every weight.
            tied_copies: ``False`` leaves out each weight the model declares tied to another
                (``all_tied_weights_keys``: ``lm_head.weight`` when ``tie_word_embeddings``),
                so a tied tensor is sent once, under its source's name (what vLLM loads).

        Returns:
            ``{hf_name: tensor}`` on rank 0, ``{}`` elsewhere.
        """
        return fc.full_state_dict(
            self.model, rank=self.rank, world_size=self.world_size, dtype=dtype, copy=copy, tied_copies=tied_copies
        )

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write model, optimizer, scheduler, RNG states and the step counter to ``path``.

        Layout (collective: every rank must call):

        - ``dcp/``: model and optimizer state, sharded, with ``torch.distributed.checkpoint``
          (each rank writes its own shards; loadable on another world size).
        - ``trainer_state.pt`` (rank 0): ``global_step``, scheduler state, world size, config.
        - ``rng_rank{r}.pt`` (each rank): torch (and CUDA), numpy and ``random`` states.
        - ``COMPLETE`` (rank 0, last, after a barrier): marks the checkpoint as whole.

        Raises:
            CheckpointError: ``path`` exists and already holds a checkpoint.
        """
        self._core.save_checkpoint(path)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore what ``save_checkpoint`` wrote. Collective.

        RNG states are per rank: when resuming on a different world size, ranks without
        a saved state keep their current one (with a warning); model and optimizer
        re-shard to the new world size.

        Raises:
            CheckpointError: ``path`` is not a complete checkpoint, or its tensors do not
                match this model.
        """
        self._core.load_checkpoint(path)

    def save_hf(
        self, path: str | os.PathLike[str], dtype: torch.dtype | None = None, *, max_shard_size: int | str = "5GB"
    ) -> None:
        """Write a Hugging Face model folder for users and for engines that load from disk
        (``AutoModelForCausalLM.from_pretrained``, vLLM): ``model.safetensors`` (or
        ``model-0000k-of-0000n.safetensors`` shards of at most ``max_shard_size`` with
        ``model.safetensors.index.json``), ``config.json``, ``generation_config.json`` where
        the model has one, and the tokenizer and chat-template files found in
        ``config.model_path`` (``export.TOKENIZER_FILES``). Collective; rank 0 writes.

        Tied weights (``tie_word_embeddings``) are stored once, under the key
        ``from_pretrained`` ties again from (``model.embed_tokens.weight`` for Llama; see
        ``agentrl.trainer.export.drop_tied_copies``). ``config.json`` carries ``use_cache`` and
        dropout as the model folder has them (the trainer turns them off for scoring) and
        the ``dtype`` written. Every file gets the mode of a newly created file under the
        umask (``export.follow_umask``). ``full_state_dict`` (the weight sync) is unchanged.

        Args:
            path: target folder (created; files of an earlier save are overwritten).
            dtype: weight dtype written (``None``: fp32, the master weights).
            max_shard_size: largest safetensors file (``"5GB"``, or bytes as an int).

        Raises:
            ContractError: two weights declared tied hold different values.
        """
        sd = self.full_state_dict(dtype)
        if self.rank == 0:
            hf_export.write_hf_folder(self.model, sd, path, self.config.model_path, dtype, max_shard_size=max_shard_size)
        dist.barrier()
