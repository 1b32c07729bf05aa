"""Peak memory of a stretch of work (``perf/peak_memory_mb`` of ``PolicyTrainer.step``)."""

from __future__ import annotations

import resource

import torch


class PeakMemory:
    """Peak memory of a stretch of work, in MB: CUDA's max allocated bytes on a CUDA
    device, else the growth of the process's peak resident set (Linux ``VmHWM``, reset
    at ``start`` through ``/proc/self/clear_refs``; where that cannot be reset, the growth
    of ``ru_maxrss``, which misses peaks below an earlier one)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._base = 0
        self._hwm_reset = False

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._hwm_reset = True
        except OSError:
            self._hwm_reset = False
        self._base = _rss_kb() if self._hwm_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        peak = _status_kb("VmHWM") if self._hwm_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return max(0, peak - self._base) / 1024.0


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _rss_kb() -> int:
    return _status_kb("VmRSS")
