"""What this machine and this process have: free memory (``/proc/meminfo``, capped by a cgroup's
limit, or the GPU's), the accelerator, the devices a run's ``trainer`` asks for and this process's
rank. :mod:`experiments.plan` asks it when a run is planned; nothing here decides about a run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from experiments.config import TrainerConfig


def runs_on_accelerator(trainer: TrainerConfig) -> bool:
    """Whether the run trains on a GPU (``trainer.accelerator`` gpu/cuda, or auto with CUDA present)."""
    return trainer.accelerator in ("gpu", "cuda") or (trainer.accelerator == "auto" and cuda_available())


def available_memory(accelerator: str) -> tuple[int, str] | None:
    """(bytes free, where) for the accelerator: the GPU's free memory (``torch.cuda.mem_get_info``
    of this process's local rank), or the RAM the kernel says is available (``MemAvailable``,
    capped by a cgroup limit); None where it cannot be known."""
    if accelerator in ("gpu", "cuda"):
        if not cuda_available():
            return None
        import torch

        free, _ = torch.cuda.mem_get_info(int(os.environ.get("LOCAL_RANK", "0")))
        return free, " on the GPU"
    if accelerator not in ("cpu", "auto"):
        return None
    ram = _mem_available()
    return (ram, " in RAM") if ram is not None else None


def _mem_available() -> int | None:
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except OSError:
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return None
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            cap = int(Path(limit).read_text()) - int(Path(usage).read_text())
        except (OSError, ValueError):  # absent, or "max"
            continue
        free = min(free, max(cap, 0))
    return free


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def launched_rank() -> int:
    """The global rank a launcher gave this process (Lightning's order of variables); 0 when none."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def known_processes(trainer: TrainerConfig) -> int | None:
    """Training processes over every node, or None where ``devices`` is ``auto`` (or -1) on a GPU
    run and no GPU is visible here (a login node) to count them."""
    on_gpu = runs_on_accelerator(trainer)
    devices = _parsed_devices(trainer.devices)
    named = isinstance(devices, (list, tuple)) or (isinstance(devices, int) and devices > 0)
    if on_gpu and not named and not cuda_available():
        return None
    return processes_per_node(devices, on_gpu) * max(trainer.num_nodes, 1)


def processes_per_node(devices: object, on_gpu: bool) -> int:
    """Training processes on one node: Lightning's ``devices`` (``auto`` or -1: every GPU, or 1 on a CPU)."""
    devices = _parsed_devices(devices)
    if isinstance(devices, (list, tuple)):
        return max(len(devices), 1)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return devices
    if on_gpu and cuda_available():
        import torch

        return max(torch.cuda.device_count(), 1)
    return 1


def _parsed_devices(devices: object) -> object:
    """Lightning's ``devices`` with a number given as text (``"2"``, ``"-1"``) made an int."""
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        return int(devices)
    return devices
