"""``tiny-semantic``: ``tiny-random-smollm2`` (2 layers, hidden 64, tied embeddings) whose token
embedding matrix is SmolLM2-135M's projected onto its top 64 principal components, for
``tests/benchmarks/bench_async.py --env words --model-variant semantic``.

Why
    The learning-curve half of the async benchmark (bench_async.py) needs a model that learns something
    within 20 updates on this machine, and SmolLM2 training does not fit beside the other
    jobs (15 GB per step). The random tiny model learns it slowly and late: its embeddings
    are random, so any class of tokens a text reward favours (say, lowercase words) is
    scattered uniformly in its 64-dimensional space and the policy gradient has no shared
    direction to follow. At lr 3e-3 its entropy stayed at 10.79 of ln 49152 = 10.80 nats and
    its reward flat over 12 updates; at lr 3e-2 nothing moved for 7 updates, then it climbed
    (0.58 -> 0.89 at update 11) by collapsing its entropy to 4.6 nats. With
    SmolLM2's embeddings (PCA to 64 dimensions, centred, scaled to the random init's
    standard deviation) token features such as case, a leading space or being a digit are
    directions of the embedding space, as in the real model, so moving the final hidden
    state along a few directions moves the probability of a whole class of tokens. The rest
    of the network stays random; both modes of a benchmark run the same model.

Made once per output folder (``build(out_dir)``, a few seconds: the two checkpoints are read
with ``safetensors``; nothing is trained).
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["EMBED_KEY", "build", "pca_embeddings"]

EMBED_KEY = "model.embed_tokens.weight"


def pca_embeddings(source, dim: int, std: float):
    """``source`` ``[V, D]`` float32 centred and projected on its top ``dim`` principal
    directions (``torch.pca_lowrank``, seeded), then scaled to standard deviation ``std``:
    ``[V, dim]`` float32.

    Raises:
        ValueError: ``dim`` > ``D`` or ``std`` <= 0.
    """
    import torch

    v, d = source.shape
    if dim > d or std <= 0:
        raise ValueError(f"dim={dim} must be <= the source's {d} columns and std={std} > 0")
    x = source.float() - source.float().mean(dim=0, keepdim=True)  # (V, D)
    torch.manual_seed(0)
    _, _, basis = torch.pca_lowrank(x, q=dim, center=False, niter=4)  # (D, dim)
    proj = x @ basis  # (V, dim)
    return (proj * (std / proj.std())).contiguous()


def build(out_dir: Path, tiny_dir: Path, smollm2_dir: Path) -> Path:
    """Write the ``tiny-semantic`` model into ``out_dir`` (config, tokenizer files and
    ``model.safetensors`` of ``tiny_dir``, the embedding replaced) unless it is there; returns
    ``out_dir``.

    Raises:
        ValueError: the two models' vocabularies differ.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if (out_dir / "model.safetensors").is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    with safe_open(str(Path(tiny_dir) / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    with safe_open(str(Path(smollm2_dir) / "model.safetensors"), "pt") as f:
        big = f.get_tensor(EMBED_KEY)  # (V, 576)
    small = tensors[EMBED_KEY]  # (V, 64)
    if big.shape[0] != small.shape[0]:
        raise ValueError(f"vocabularies differ: {big.shape[0]} (SmolLM2) against {small.shape[0]} (tiny)")
    tensors[EMBED_KEY] = pca_embeddings(big, small.shape[1], float(small.float().std()))
    for p in Path(tiny_dir).iterdir():
        if p.is_file() and p.name != "model.safetensors":
            shutil.copy2(p, out_dir / p.name)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir
