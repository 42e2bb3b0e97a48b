"""Does this engine see a GPU, and can numba run a kernel on it? (``coursekit preflight``)

:func:`probe` runs on each engine. It asks numba which GPUs this process sees (numba
counts the ones ``CUDA_VISIBLE_DEVICES`` leaves visible), binds the one the training
chapters will use (local rank % GPUs, :func:`coursekit.nn.kernels_cuda.bind_engine_gpu`),
then compiles and launches a tiny kernel there and checks what it wrote. Every failure
(no driver, no GPU, a kernel that does not compile or returns wrong numbers) becomes text
in the answer, never an exception: a preflight reports, it does not crash.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["probe", "describe"]

_N = 32  # threads of the test kernel: one small block
cuda = None  # numba.cuda, imported by probe(): slow to import, and only where asked


def _odd(x):
    """The test kernel: x[i] = 2 i + 1. A module-level function on the global ``cuda``,
    which is what numba's simulator swaps for its fake module during a launch."""
    i = cuda.grid(1)
    if i < x.size:
        x[i] = 2 * i + 1


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split())  # numba's driver errors span several lines
    return f"{type(err).__name__}: {text[:300]}"


def _local_rank() -> int | None:
    from coursekit.cluster import this_engine

    try:
        return this_engine().local_rank
    except RuntimeError:  # not on an engine
        return None


def _kernel_check() -> str:
    """"ok", or what went wrong compiling / launching / checking ``x[i] = 2 i + 1``."""
    try:
        d = cuda.to_device(np.zeros(_N, np.int64))
        cuda.jit(_odd)[1, _N](d)
        got = d.copy_to_host()
    except Exception as err:  # noqa: BLE001 - reported, not raised
        return _first_line(err)
    want = 2 * np.arange(_N) + 1
    if not np.array_equal(got, want):
        return f"wrong result: the kernel wrote {got[:4].tolist()}..., expected {want[:4].tolist()}..."
    return "ok"


def probe() -> dict:
    """This process's GPU as the training chapters will use it.

    ``{"gpus": GPUs numba sees, "gpu": the id bound (None without one), "name": its name,
    "local_rank": the engine's (None off an engine), "cuda_visible_devices": the variable,
    "simulator": NUMBA_ENABLE_CUDASIM is on, "kernel": "ok" or the error text ("" when no
    GPU), "error": why there is no GPU ("" when there is)}``.
    """
    out = {"gpus": 0, "gpu": None, "name": "", "local_rank": _local_rank(),
           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "simulator": False,
           "kernel": "", "error": ""}
    global cuda
    try:
        import numba
        from numba import cuda

        out["simulator"] = bool(numba.config.ENABLE_CUDASIM)
        if not cuda.is_available():
            try:
                len(cuda.gpus)  # raises with the driver's reason when there is one
            except Exception as err:  # noqa: BLE001
                out["error"] = _first_line(err)
            else:
                out["error"] = "numba finds no usable CUDA GPU"
            return out
        out["gpus"] = len(cuda.gpus)
        from coursekit.nn.kernels_cuda import bind_engine_gpu
        from coursekit.nn.mlp import device_name

        bind_engine_gpu()  # on an engine: GPU local_rank % gpus, as training binds it
        out["gpu"] = int(device_name("cuda").split(":")[1])
        name = getattr(cuda.current_context().device, "name", "numba CUDA simulator")
        out["name"] = name.decode() if isinstance(name, bytes) else str(name)
    except Exception as err:  # noqa: BLE001 - a broken CUDA set-up is a finding, not a crash
        out["error"] = _first_line(err)
        return out
    out["kernel"] = _kernel_check()
    return out


def describe(gpu: dict) -> str:
    """One line for the report: "GPU 1 of 2 (NVIDIA H100), kernel ok" or "no GPU (...)"."""
    visible = gpu.get("cuda_visible_devices")
    where = f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "CUDA_VISIBLE_DEVICES unset"
    if gpu["gpu"] is None:
        return f"no GPU ({gpu['error'] or 'numba finds none'}; {where})"
    rank = gpu["local_rank"]
    by = f"local rank {rank} -> " if rank is not None else ""
    return (f"{by}GPU {gpu['gpu']} of {gpu['gpus']} ({gpu['name']}; {where}), "
            f"kernel {gpu['kernel']}")
