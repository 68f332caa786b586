"""Which CUDA device this rank drives, and which physical GPU that is.

torchrun gives every worker all the node's GPUs and a LOCAL_RANK to pick one; `srun --gpus-per-task=1` or
`--gpu-bind` give each task its own GPU, visible as device 0, so LOCAL_RANK is not an ordinal there. The choice
is a pure function of what the launcher said and how many devices CUDA shows.
"""

from __future__ import annotations

from gpucert.config.loader import ConfigError


def pick_ordinal(local_rank: int, local_world_size: int, visible: int, cuda_visible_devices: str | None) -> int:
    """The CUDA ordinal for this local rank, or an error saying what the launcher gave and what to change."""
    if visible >= local_world_size and local_rank < visible:
        return local_rank  # every task sees the whole node (torchrun, srun without binding)
    if visible == 1:
        return 0  # one GPU per task (--gpus-per-task=1, --gpu-bind=single:1, map_gpu)
    shown = "unset" if cuda_visible_devices is None else repr(cuda_visible_devices)
    raise ConfigError(
        f"local rank {local_rank} of {local_world_size} sees {visible} CUDA device(s) "
        f"(CUDA_VISIBLE_DEVICES {shown}): expected all of the node's GPUs or exactly one; "
        "give every task one GPU (srun --gpus-per-task=1) or all of them, and one task per GPU"
    )


def gpu_uuid_and_index(ordinal: int) -> tuple[str | None, int | None]:
    """The GPU's UUID (from CUDA) and its NVML index (the one nvidia-smi shows), matched by UUID."""
    import torch

    try:
        raw = str(torch.cuda.get_device_properties(ordinal).uuid)
    except (RuntimeError, AttributeError):
        return None, None
    uuid = raw if raw.startswith("GPU-") else f"GPU-{raw}"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            return uuid, int(pynvml.nvmlDeviceGetIndex(handle))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        # NVML missing in a container that still has CUDA: the UUID alone names the GPU.
        return uuid, None


def gpu_count() -> int:
    """CUDA devices this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_nproc() -> int:
    """One process per visible GPU; two gloo processes on a CPU machine, so collectives have a peer."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 2
