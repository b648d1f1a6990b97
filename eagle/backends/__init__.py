"""How a target forward runs on a machine: the one seam between the algorithm and the hardware.

The algorithm (``Target``, the decoder, the drafters) asks a :class:`~eagle.backends.base.Backend`
to prepare the model, to pick the decoder and compiled form of a step, and for the LM-head product
and its greedy argmax; nothing above this package names an instruction set or a vendor library.

* ``eager``: plain transformers + SDPA (the Triton tree kernel where a Target asks for it); any
  device; the reference every other backend is tested against.
* ``cpu``: the CPU speed machinery (eagle/backends/cpu: packed twin, compiled layer regions, the
  small-row GEMM, the screened argmax, the bfloat16 attention op) and its start-up measurements.
* ``cuda``: the eager backend with CUDA graphs for compiled steps and the tree kernel by default.

``runtime.backend: auto`` takes ``cuda`` on a CUDA device, ``cpu`` on an x86 CPU where the CPU
extension builds, else ``eager``. Backends are imported by name, only when one is made.
"""
from __future__ import annotations

import importlib

__all__ = ["BACKENDS", "BackendError", "make_backend", "resolve_backend", "native_bf16"]

from ..runtime import BACKENDS
_MODULES = {"eager": "eagle.backends.eager", "cpu": "eagle.backends.cpu", "cuda": "eagle.backends.cuda"}


class BackendError(ValueError):
    """A backend that cannot run here (e.g. ``cuda`` without a CUDA device); one line, naming it."""


def _backend_class(name: str):
    return importlib.import_module(_MODULES[name]).BACKEND


def resolve_backend(name: str, device) -> str:
    """The backend ``name`` (one of :data:`BACKENDS`) stands for on ``device``; ``auto`` picks
    (module docstring), an explicit name is checked; :class:`BackendError` where it cannot run."""
    import torch

    device = torch.device(device)
    if name not in BACKENDS:
        raise BackendError(f"runtime.backend must be one of {BACKENDS}, got '{name}'")
    if name == "auto":
        if device.type == "cuda":
            return "cuda"
        return "cpu" if device.type == "cpu" and _backend_class("cpu").preferred(device) else "eager"
    why = _backend_class(name).usable(device)
    if why is not None:
        raise BackendError(f"runtime.backend '{name}' cannot run here: {why}")
    return name


def make_backend(name: str = "auto", device="cpu", **options):
    """A new backend (one per Target: it holds that model's prepared copies); ``options``: the
    backend class's own keyword arguments (e.g. the CPU backend's ``linear`` way)."""
    return _backend_class(resolve_backend(name, device))(device, **options)


def native_bf16(device="cpu", cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether bfloat16 products run natively on ``device`` (CUDA, or a CPU with AVX512-BF16 or
    AMX-BF16): where ``auto`` precisions of drafting and training pick bfloat16."""
    import torch

    if torch.device(device).type == "cuda":
        return True
    from eagle_kernels.cpuinfo import native_bf16_cpu

    return native_bf16_cpu(cpuinfo)
