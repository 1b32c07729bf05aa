"""The trainer's side of ``agentrl export``: what turns trainer weights into a plain Hugging
Face folder, and the independent re-scoring that checks the folder against the trainer.

Imports torch and transformers only (docs/design.md, "Who may import whom"); the run directory,
checkpoint choice and the command live in ``agentrl.commands.export``.

Measured decisions (tiny random SmolLM2, fp32, CPU, 3 chat-template rows of 33 to 46
tokens):

- Tied embeddings. ``full_state_dict`` returns ``lm_head.weight`` and
  ``model.embed_tokens.weight`` as two separate tensors (a gather, then a copy), so
  ``save_pretrained`` cannot see that they are one parameter and writes both: 108 MiB
  extra for SmolLM2-135M (49,152 x 576 fp32). ``drop_tied_copies`` removes each tied
  *target* of the model's ``all_tied_weights_keys`` (``{target: source}``, e.g.
  ``{"lm_head.weight": "model.embed_tokens.weight"}``) and keeps the source, the key
  ``from_pretrained`` re-ties from.
- Re-scoring. The exported folder, loaded with plain ``AutoModelForCausalLM`` and scored
  one row at a time without padding, gives log-probs bit-identical to the trainer's
  (FSDP2, one row per micro-batch, packed or padded layout). Rows batched together go
  through matrix products of another shape and round differently: up to 7.6e-6 on
  SmolLM2-135M, with no export involved (``agentrl.commands.export`` scores one row per
  micro-batch for that reason). The log-prob is taken as ``z[y] - logsumexp(z)`` with
  ``z = logits / T`` (the definition of ``log_softmax`` at the label, and the trainer's
  formula). ``torch.log_softmax(z)[y]`` rounds differently (it subtracts the max first):
  1.9e-6 off at ``|log p|`` of about 11 (two fp32 ulps) from identical logits, which alone
  would break a 1e-6 check.
- File modes. safetensors (0.8) writes ``model.safetensors`` through a private temporary
  file, so it lands with mode 0600 while ``save_pretrained``'s JSON files get 0644 under a
  umask of 022: a folder others (a serving user, a shared model directory) can read except
  its weights. ``follow_umask`` gives every file the mode a normally created file gets.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from agentrl.errors import ContractError


def drop_tied_copies(state_dict: Mapping[str, torch.Tensor], tied: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """``state_dict`` without the tied copies: every ``target`` of ``tied`` whose ``source``
    is also present is removed, so a tied tensor is stored once, under the key
    ``from_pretrained`` re-ties from.

    Args:
        state_dict: ``{hf_name: tensor}`` (e.g. ``PolicyTrainer.full_state_dict()``).
        tied: ``{target: source}``, the model's ``all_tied_weights_keys`` (empty when
            ``tie_word_embeddings`` is false).

    Returns:
        A new dict (the tensors themselves are not copied).

    Raises:
        ContractError: a target and its source differ in shape or value (they are declared
            tied, so dropping one would change the model).
    """
    out = dict(state_dict)
    for target, source in tied.items():
        if target not in out or source not in out:
            continue
        a, b = out[target], out[source]
        if a.shape != b.shape or not torch.equal(a, b):
            raise ContractError(
                f"{target!r} is declared tied to {source!r} but they differ (shapes {tuple(a.shape)} "
                f"and {tuple(b.shape)}); refusing to store only one of them"
            )
        del out[target]
    return out


def untied_pairs(model: torch.nn.Module) -> list[tuple[str, str]]:
    """The ``(target, source)`` pairs of ``model.all_tied_weights_keys`` whose parameters do
    not share storage: empty when ``from_pretrained`` tied every declared pair again."""
    params = dict(model.named_parameters(remove_duplicate=False))
    bad = []
    for target, source in (getattr(model, "all_tied_weights_keys", None) or {}).items():
        a, b = params.get(target), params.get(source)
        if a is None or b is None or a.data_ptr() != b.data_ptr():
            bad.append((target, source))
    return bad


def load_hf_folder(path: str | os.PathLike[str], attn_implementation: str = "sdpa") -> torch.nn.Module:
    """``AutoModelForCausalLM.from_pretrained(path)`` in fp32, eval mode: what a user of the
    exported folder gets."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn_implementation)
    return model.eval()


@torch.no_grad()
def reference_log_probs(
    model: torch.nn.Module, input_ids: torch.Tensor, seq_lens: Sequence[int] | torch.Tensor, temperature: float
) -> torch.Tensor:
    """Per-token log-probs of packed rows under a plain Hugging Face model, scored one row at
    a time (no padding, no position ids: what any user of the folder would compute).

    ``log p(ids[t] | ids[row_start:t]) = z[t-1, ids[t]] - logsumexp(z[t-1])`` with
    ``z = logits / temperature`` in fp32 (the module docstring says why not
    ``torch.log_softmax``).

    Args:
        model: a causal LM (e.g. ``load_hf_folder``).
        input_ids: ``[T]`` int64, the rows concatenated.
        seq_lens: ``[B]`` row lengths, summing to ``T``.
        temperature: > 0.

    Returns:
        ``[T]`` float32 on CPU, 0 at each row's first token (the layout of
        ``PolicyTrainer.compute_log_probs``).

    Raises:
        ContractError: ``seq_lens`` does not sum to ``len(input_ids)``, or a temperature
            that is not > 0.
    """
    lens = [int(n) for n in (seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else seq_lens)]
    if sum(lens) != int(input_ids.shape[0]) or any(n < 1 for n in lens):
        raise ContractError(f"seq_lens {lens} must be >= 1 each and sum to len(input_ids)={int(input_ids.shape[0])}")
    if not temperature > 0:
        raise ContractError(f"temperature={temperature}; expected > 0")
    device = next(model.parameters()).device
    out = []
    start = 0
    for n in lens:
        ids = input_ids[start : start + n].to(device)  # (L,)
        start += n
        z = model(input_ids=ids[None]).logits[0].float() / temperature  # (L, V)
        picked = z[:-1].gather(-1, ids[1:, None])[:, 0]  # (L-1,)
        lp = picked - torch.logsumexp(z[:-1], dim=-1)  # (L-1,)
        out.append(torch.cat([torch.zeros(1, device=device), lp]).cpu())  # (L,)
    return torch.cat(out)  # (T,)


def current_umask() -> int:
    """The process's file mode creation mask (e.g. ``0o022``): read from ``/proc/self/status``
    where Linux reports it (no change of process state, safe beside other threads), else set
    and restored at once with ``os.umask``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(folder: str | os.PathLike[str]) -> None:
    """Give every regular file directly in ``folder`` the mode a newly created file gets
    under the process's umask (``0o666 & ~umask``; 0644 under the usual 022): writers that
    go through a private temporary file (safetensors) leave 0600 behind. Links and
    sub-folders are left alone."""
    from pathlib import Path

    mode = 0o666 & ~current_umask()
    for p in Path(folder).iterdir():
        if p.is_file() and not p.is_symlink():
            p.chmod(mode)


def restore_user_config(written: str | os.PathLike[str], source: str | os.PathLike[str], dtype: torch.dtype) -> None:
    """Rewrite the ``config.json`` that ``save_pretrained`` wrote at ``written`` so that it
    says what a user of the folder needs: ``use_cache`` and every ``*dropout*`` float as the
    source model folder's ``config.json`` has them (the trainer turns both off for scoring;
    without a source file ``use_cache`` is set to true, the transformers default), and
    ``dtype`` the dtype of the weights written (``"bfloat16"`` for a bf16 export, which
    vLLM's ``dtype="auto"`` reads)."""
    import json
    from pathlib import Path

    written, source = Path(written), Path(source)
    cfg = json.loads(written.read_text())
    src = json.loads(source.read_text()) if source.is_file() else {"use_cache": True}
    for key, value in src.items():
        if key == "use_cache" or ("dropout" in key and isinstance(value, float)):
            cfg[key] = value
    cfg["dtype"] = str(dtype).removeprefix("torch.")
    written.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# What save_hf copies from the model folder besides what save_pretrained writes: the
# tokenizer (fast and slow forms) and the chat template (file forms of transformers >= 4.43).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


def write_hf_folder(
    model: torch.nn.Module,
    sd: dict[str, torch.Tensor],
    path: str | os.PathLike[str],
    model_path: str | os.PathLike[str],
    dtype: torch.dtype | None,
    *,
    max_shard_size: int | str,
) -> None:
    """Write ``model`` (a transformers ``PreTrainedModel``) with the full weights ``sd`` as
    a Hugging Face folder at ``path`` (``PolicyTrainer.save_hf`` documents the layout): the
    tied copies dropped (``drop_tied_copies``), ``config.json`` restored from
    ``model_path``'s (``restore_user_config``), the tokenizer and chat-template files of
    ``model_path`` (``TOKENIZER_FILES``) copied, the files' modes following the umask.

    Raises:
        ContractError: two weights declared tied hold different values.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sd = drop_tied_copies(sd, getattr(model, "all_tied_weights_keys", None) or {})
    model.save_pretrained(path, state_dict=sd, max_shard_size=max_shard_size)
    src = Path(model_path)
    restore_user_config(path / "config.json", src / "config.json", dtype or torch.float32)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, path / name)
    follow_umask(path)  # safetensors writes 0600; the folder is for users
