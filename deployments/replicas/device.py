"""Which device and precision a model replica runs on, from what Ray assigned to it."""

from __future__ import annotations

import torch


def assigned_device() -> str:
    """CUDA when Ray gave this replica a GPU (`num_gpus` > 0 in `ray_actor_options`),
    CPU otherwise. Outside a Ray worker (tests, the bare-model bench) it falls back to
    whatever torch can see."""
    try:
        import ray

        if ray.is_initialized():
            return "cuda" if ray.get_gpu_ids() else "cpu"
    except ImportError:  # pragma: no cover - ray is a dependency
        pass
    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_dtype(name: str, device: str) -> torch.dtype:
    """`auto` is half precision on a GPU (tensor cores, half the memory) and float32 on a
    CPU, where float16 kernels are slow or missing."""
    if name == "auto":
        return torch.float16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]
