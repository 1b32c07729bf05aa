"""Input conversion and grouped statistics shared by the estimators (private).

Everything here works on float64 numpy arrays and integer group codes, so every estimator
is vectorized: keys are factorized once (``np.unique`` / a dense table / a dict for arbitrary
hashables), then group sums, sums of squares, minima and maxima come from ``np.bincount``
and ``np.{maximum,minimum}.at``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Hashable

import numpy as np

from agentrl.errors import ConfigError, ContractError

CONSTANT_RTOL = 1e-12
"""A group whose values span at most ``CONSTANT_RTOL * max(|min|, |max|)`` is *constant*:
its advantages are exactly 0.0. This catches rewards that are equal but were computed by
different float paths (``0.1 + 0.2`` vs ``0.3``), whose float-noise deviation divided by a
float-noise std would otherwise give O(1) advantages."""


def to_numpy(x: Any) -> Any:
    """A torch tensor becomes a numpy array (detached, on CPU); anything else is returned."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch

        if isinstance(x, torch.Tensor):
            t = x.detach().cpu()
            if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
                t = t.to(torch.float64)
            return t.numpy()
    return x


def _element_to_float(v: Any, name: str, index: Any) -> float:
    if v is None:
        return math.nan
    if isinstance(v, (bool, np.bool_, numbers.Real)):
        return float(v)
    v_np = to_numpy(v)  # a 0-d torch tensor
    if isinstance(v_np, np.ndarray) and v_np.ndim == 0 and v_np.dtype.kind in "biuf":
        return float(v_np)
    raise ContractError(
        f"{name}[{index}]={v!r} (type {type(v).__name__}) is not a number; expected a real "
        "number, or None/NaN for a failed sample"
    )


def as_float_vector(x: Any, name: str, *, allow_missing: bool) -> np.ndarray:
    """Convert a sequence / numpy array / torch tensor to a 1-D float64 array.

    ``None`` becomes NaN. With ``allow_missing=False`` a NaN/inf/None raises ContractError.
    Strings and other non-numbers raise ContractError naming the element.
    """
    x = to_numpy(x)
    if isinstance(x, (str, bytes)):
        raise ContractError(f"{name}={x!r} is a string; expected a sequence of numbers")
    if isinstance(x, np.ndarray) and x.dtype.kind in "biuf":
        arr = np.asarray(x, dtype=np.float64)
    else:
        try:
            seq = list(x)
        except TypeError as exc:
            raise ContractError(
                f"{name} is a {type(x).__name__}; expected a 1-D sequence, numpy array or tensor"
            ) from exc
        try:
            raw = np.asarray(seq)
        except ValueError as exc:  # ragged nesting
            raise ContractError(f"{name} is not a flat sequence of numbers: {exc}") from exc
        if raw.dtype.kind in "biuf":
            arr = raw.astype(np.float64, copy=False)
        elif raw.ndim == 1:  # object (None mixed in) or strings: check element by element
            arr = np.array(
                [_element_to_float(v, name, i) for i, v in enumerate(seq)], dtype=np.float64
            )
        else:
            raise ContractError(
                f"{name} has shape {tuple(raw.shape)} and dtype {raw.dtype}; expected a 1-D "
                "sequence of numbers [N]"
            )
    if arr.ndim != 1:
        raise ContractError(f"{name} has shape {tuple(arr.shape)}; expected a 1-D sequence [N]")
    if not allow_missing:
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise ContractError(
                f"{name}[{int(bad[0])}]={float(arr[bad[0]])!r} is not finite; expected finite values"
            )
    return arr


def as_float_array(x: Any, name: str, ndim: int) -> np.ndarray:
    """Numeric array of exactly ``ndim`` dimensions as float64 (no None allowed)."""
    x = to_numpy(x)
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ContractError(f"{name} could not be read as a numeric array: {exc}") from exc
    if arr.ndim != ndim:
        raise ContractError(f"{name} has shape {tuple(arr.shape)}; expected {ndim} dimension(s)")
    return arr


def check_same_length(a: int, a_name: str, b: int, b_name: str, what: str) -> None:
    if a != b:
        raise ContractError(
            f"{a_name} has {a} values but {b_name} has {b}; expected one per {what}"
        )


def _dense_int_codes(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Factorize an integer array. Codes follow the sorted order of the values."""
    if x.size == 0:
        return np.zeros(0, dtype=np.int64), 0
    lo, hi = int(x.min()), int(x.max())
    span = hi - lo + 1
    if span <= max(4 * x.size, 1 << 16):
        shifted = (x - lo).astype(np.int64, copy=False)
        present = np.zeros(span, dtype=bool)
        present[shifted] = True
        remap = np.cumsum(present, dtype=np.int64) - 1
        return remap[shifted], int(present.sum())
    uniq, inv = np.unique(x, return_inverse=True)
    return inv.reshape(-1).astype(np.int64, copy=False), int(uniq.size)


def factorize(keys: Any, name: str) -> tuple[np.ndarray, int, list[Hashable] | np.ndarray]:
    """Map hashable keys to integer codes ``0..K-1``.

    Returns ``(codes [N] int64, K, uniques)`` with ``uniques[codes[i]] == keys[i]``
    (equality as Python's ``==``/``hash``; numeric numpy arrays use numeric equality).

    Raises:
        ContractError: a key is not hashable.
    """
    keys = to_numpy(keys)
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "biuf":
        flat = keys.reshape(-1)
        if flat.dtype.kind in "biu":
            codes, k = _dense_int_codes(flat)
            uniques = np.empty(k, dtype=flat.dtype)
            uniques[codes] = flat
            return codes, k, uniques
        uniq, inv = np.unique(flat, return_inverse=True)
        return inv.reshape(-1).astype(np.int64, copy=False), int(uniq.size), uniq
    if isinstance(keys, np.ndarray):
        keys = keys.reshape(-1).tolist()
    if isinstance(keys, (str, bytes)):
        raise ContractError(f"{name}={keys!r} is a string; expected one key per sample")
    table: dict[Hashable, int] = {}
    setdefault = table.setdefault
    try:
        codes_list = [setdefault(k, len(table)) for k in keys]
    except TypeError as exc:
        for i, k in enumerate(keys):
            try:
                hash(k)
            except TypeError:
                raise ContractError(
                    f"{name}[{i}]={k!r} is not hashable; expected a hashable key "
                    "(str, int, tuple, ...)"
                ) from exc
        raise
    codes = np.fromiter(codes_list, dtype=np.int64, count=len(codes_list))
    return codes, len(table), list(table)


def check_eps(eps: float, name: str = "eps") -> float:
    if not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps < 0:
        raise ConfigError(f"{name}={eps!r}; expected a finite number >= 0")
    return float(eps)


def check_unit_interval(value: float, name: str) -> float:
    if not isinstance(value, numbers.Real) or not (0.0 <= float(value) <= 1.0):
        raise ConfigError(f"{name}={value!r}; expected a number in [0, 1]")
    return float(value)


def constant_groups(values: np.ndarray, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """``[K]`` bool: True for groups with at most one member or whose values are all equal
    (to within ``CONSTANT_RTOL``, relative). Groups without members are True."""
    counts = np.bincount(codes, minlength=n_groups)
    vmax = np.full(n_groups, -np.inf)
    vmin = np.full(n_groups, np.inf)
    np.maximum.at(vmax, codes, values)
    np.minimum.at(vmin, codes, values)
    with np.errstate(invalid="ignore"):
        scale = np.maximum(np.abs(vmax), np.abs(vmin))
        spread = vmax - vmin
        const = (counts <= 1) | (spread <= CONSTANT_RTOL * scale)
    return const


def group_normalize(
    values: np.ndarray,
    codes: np.ndarray,
    n_groups: int,
    *,
    use_std: bool,
    eps: float,
    weights: np.ndarray | None = None,
    leave_one_out: bool = False,
) -> np.ndarray:
    """Group-relative advantages of finite ``values [M]`` grouped by ``codes [M]``.

    ``weights [M]`` (positive integers) count each value that many times (used for
    GiGPO's per-step episode statistics without materializing the repeats).

    * baseline: group mean, or with ``leave_one_out`` the mean of the *other* samples
      (``A_i = r_i - (S - r_i)/(n - 1) = n/(n - 1) * (r_i - mean)``);
    * ``use_std``: divide by the unbiased (ddof=1) group std plus ``eps``;
    * a constant group (see ``constant_groups``: size 1 or all values equal) gives
      exactly 0.0, decided before any division.

    Returns ``[M]`` float64 advantages, always finite for finite input.
    """
    if values.size == 0:
        return np.zeros(0, dtype=np.float64)
    w = np.ones_like(values) if weights is None else weights.astype(np.float64, copy=False)
    n = np.bincount(codes, weights=w, minlength=n_groups)
    s = np.bincount(codes, weights=w * values, minlength=n_groups)
    safe_n = np.where(n > 0, n, 1.0)
    mean = s / safe_n
    dev = values - mean[codes]  # [M]
    const = constant_groups(values, codes, n_groups) | (n <= 1)
    if leave_one_out:
        factor = np.where(n > 1, n / np.where(n > 1, n - 1.0, 1.0), 0.0)
        adv = dev * factor[codes]
    else:
        adv = dev
    if use_std:
        ss = np.bincount(codes, weights=w * dev * dev, minlength=n_groups)
        std = np.sqrt(ss / np.where(n > 1, n - 1.0, 1.0))  # unbiased, ddof=1
        denom = std + eps
        const |= ~(denom > 0) | ~np.isfinite(denom)
        adv = adv / np.where(const, 1.0, denom)[codes]
    adv = np.where(const[codes], 0.0, adv)
    return adv.astype(np.float64, copy=False)
