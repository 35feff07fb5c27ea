"""What hardware is here, and how the course uses it. A lesson script picks by itself: with a CUDA
GPU, NCCL and a GPU per process (``cuda:LOCAL_RANK``, or ``cuda:0`` if given only its own); without,
Gloo on the CPU, its cores split between the processes; ``DDP_BACKEND`` overrides. ``plan`` decides
for a launch from this kernel, which sees every GPU: NCCL with a GPU per process, else Gloo, passed
as ``DDP_BACKEND`` where the scripts would pick NCCL. ``course_sizes`` sizes the experiments.
"""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import dataclass

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class Hardware:
    """A snapshot of the compute this kernel can see."""

    cpu_cores: int
    cpu_model: str
    cuda_gpus: int
    gpu_names: tuple[str, ...]
    nccl_available: bool
    gloo_available: bool
    torch_version: str
    cuda_version: str | None

    def summary(self) -> str:
        """A few lines for a person: what is here, in words."""
        lines = [
            f"CPU      : {self.cpu_model} ({self.cpu_cores} usable cores)",
            f"GPUs     : {self.cuda_gpus}"
            + (f" ({', '.join(self.gpu_names)})" if self.gpu_names
               else " (no CUDA device visible)"),
            f"PyTorch  : {self.torch_version}"
            + (f", built with CUDA {self.cuda_version}" if self.cuda_version else ", CPU build"),
            f"Backends : gloo {'yes' if self.gloo_available else 'no'}, "
            f"nccl {'yes' if self.nccl_available else 'no'}",
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class Plan:
    """How ``nproc_per_node`` processes will run on this machine, and why."""

    nproc_per_node: int
    backend: str
    device_type: str
    threads_per_process: int
    reason: str
    backend_set: bool = False  # the scripts' own rule would choose otherwise: pass DDP_BACKEND

    def env(self) -> dict[str, str]:
        """What a launch must give the scripts so that they run as planned (shown with it)."""
        return {"DDP_BACKEND": self.backend} if self.backend_set else {}

    def summary(self) -> str:
        where = (
            f"cuda:0 .. cuda:{self.nproc_per_node - 1}" if self.device_type == "cuda" else "the CPU"
        )
        return (
            f"{self.nproc_per_node} process(es), backend {self.backend!r} on {where}, "
            f"{self.threads_per_process} CPU thread(s) each.\nWhy: {self.reason}"
        )


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def detect() -> Hardware:
    """Look at the machine once: CPU cores, CUDA GPUs, which distributed backends exist."""
    import course_helpers  # with torchvision: imported only where it is used
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    available = dist.is_available()
    return Hardware(
        cpu_cores=course_helpers.usable_cpu_cores(),
        cpu_model=_cpu_model(),
        cuda_gpus=gpus,
        gpu_names=tuple(torch.cuda.get_device_name(i) for i in range(gpus)),
        nccl_available=available and dist.is_nccl_available(),
        gloo_available=available and dist.is_gloo_available(),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
    )


def default_nproc_per_node(hw: Hardware | None = None) -> int:
    """One process per GPU; two CPU processes where there is no GPU."""
    hw = hw or detect()
    return hw.cuda_gpus if hw.cuda_gpus > 0 else 2


def plan(nproc_per_node: int | None = None, backend: str | None = None,
         hw: Hardware | None = None) -> Plan:
    """Choose backend and device for ``nproc_per_node`` processes on this machine.

    Args:
        nproc_per_node: processes on this machine; ``None`` means ``default_nproc_per_node``.
        backend: force ``"gloo"`` or ``"nccl"``; ``None`` chooses. NCCL needs one GPU per process.
        hw: the hardware to plan for; ``None`` detects it.

    Raises:
        ValueError: for a count below one, an unknown backend, or NCCL without enough GPUs.
    """
    hw = hw or detect()
    n = default_nproc_per_node(hw) if nproc_per_node is None else nproc_per_node
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"nproc_per_node must be an integer >= 1, got {n!r}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    enough_gpus = hw.cuda_gpus >= n
    if backend == "nccl":
        if not hw.nccl_available:
            raise ValueError("backend='nccl' was asked for, but this PyTorch build has no NCCL. "
                             "Use backend='gloo' (CPU) or leave backend=None.")
        if not enough_gpus:
            raise ValueError(
                f"backend='nccl' needs one CUDA GPU per process: {n} processes were asked for "
                f"but {hw.cuda_gpus} GPU(s) are visible. Use nproc_per_node<={hw.cuda_gpus} "
                "or backend='gloo'."
            )
    asked = backend is not None
    if backend is None:
        backend = "nccl" if enough_gpus and hw.nccl_available else "gloo"
    backend_set = asked or backend != ("nccl" if hw.cuda_gpus else "gloo")  # the scripts' rule
    if backend == "nccl":
        reason = f"{hw.cuda_gpus} CUDA GPU(s) for {n} process(es): one GPU each, NCCL between them."
        return Plan(n, "nccl", "cuda", max(1, hw.cpu_cores // n), reason, backend_set)
    if hw.cuda_gpus == 0:
        reason = "no CUDA GPU is visible, so every process trains on the CPU and talks over Gloo."
    elif not enough_gpus:
        reason = (f"{n} processes but only {hw.cuda_gpus} GPU(s): NCCL needs one GPU per process, "
                  "so the processes share the CPU and talk over Gloo (DDP_BACKEND=gloo: a script "
                  "that sees a GPU would otherwise pick NCCL and stop).")
    else:
        reason = "Gloo on the CPU was asked for."
    threads = max(1, hw.cpu_cores // n)
    reason += (f" The {hw.cpu_cores} CPU core(s) are split between the processes: "
               f"{threads} thread(s) each, so they do not fight over cores.")
    return Plan(n, "gloo", "cpu", threads, reason, backend_set)


def _tf32_flags() -> tuple[list[tuple[object, str]], str | None]:
    """The switches that let CUDA run float32 convolutions and matmuls as TF32, and their style:
    newer torch replaced ``allow_tf32`` by per-operation ``fp32_precision`` ("tf32"/"ieee") and may
    refuse to read the old flag once the new one is set, so only the newest style is used."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    if hasattr(cudnn, "conv"):
        return [(cudnn.conv, "fp32_precision"), (matmul, "fp32_precision")], "tf32"
    return [(cudnn, "allow_tf32"), (matmul, "allow_tf32")], None


def tf32_convolutions() -> bool:
    """Whether float32 convolutions on CUDA may run as TF32 now (PyTorch's default: yes)."""
    flags, style = _tf32_flags()
    obj, name = flags[0]
    value = getattr(obj, name)
    return value == style if style else bool(value)


@contextlib.contextmanager
def tf32(enabled: bool):
    """Within the block, let CUDA run float32 convolutions and matmuls as TF32 or not; then restore.
    Lesson 02 needs full float32 to compare gradients on GPUs of compute capability 8.0+."""
    flags, style = _tf32_flags()
    value = (style if enabled else "ieee") if style else enabled
    saved = [getattr(obj, name) for obj, name in flags]
    for obj, name in flags:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for (obj, name), old in zip(flags, saved, strict=True):
            setattr(obj, name, old)


@dataclass(frozen=True)
class Sizes:
    """How big the lessons' experiments are on this hardware (one place for all notebooks)."""

    train_samples: int
    test_samples: int
    epochs: int
    batch_size: int
    full_size: bool


def course_sizes(hw: Hardware | None = None) -> Sizes:
    """Small enough to run the series in minutes on CPU; the whole data set where a GPU is there
    (``DDP_WORKSHOP_FULL_SIZE=1`` forces it, ``=0`` the small size); never more than the data set
    the lessons load (``course_helpers.sample_counts``), so a lesson prints what it trains on."""
    hw = hw or detect()
    forced = os.environ.get("DDP_WORKSHOP_FULL_SIZE")
    full = hw.cuda_gpus > 0 if forced is None else forced == "1"

    import course_helpers

    on_disk_train, on_disk_test = course_helpers.sample_counts()
    if full:
        return Sizes(train_samples=on_disk_train, test_samples=on_disk_test, epochs=5,
                     batch_size=128, full_size=True)
    return Sizes(train_samples=min(4_000, on_disk_train), test_samples=min(1_000, on_disk_test),
                 epochs=2, batch_size=64, full_size=False)
