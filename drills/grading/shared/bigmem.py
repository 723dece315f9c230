"""Tensors larger than 2**31 elements on a machine with little memory, for the int64 checks.

Triton's interpreter reads a CPU tensor in place, page by page, so a cache of more than 2**31
elements only costs the pages a kernel touches when it is backed by a sparse file: `sparse_empty`
maps one (MAP_SHARED) and the grading harness hands the same file to the learner's process instead
of copying it. On a GPU it is a plain `torch.empty` on the device.

Contents start as zeros (a sparse file reads as zeros); write only the few pages a test uses.
"""

from __future__ import annotations

import atexit
import gc
import math
import os
import shutil
import tempfile
import weakref

import torch

_FILES: dict[int, tuple[str, int]] = {}  # storage data_ptr -> (path, nbytes), for the grading harness
_DIR: str | None = None


def sparse_folder() -> str:
    """The folder of this process's sparse files, made on first use (the grader makes it before it starts
    the learner's process, whose sandbox then allows it)."""
    return _folder()


_PREFIX = "drills-sparse-"


def _folder() -> str:
    global _DIR
    if _DIR is None:
        _reap_orphans()
        # The creator's pid in the name: a process that ends without running atexit (os._exit in a
        # forked grading, a kill at a timeout) leaves its folder, and the next process to make one
        # removes it, instead of a temporary folder left behind per grading.
        _DIR = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
        atexit.register(shutil.rmtree, _DIR, True)  # removed at exit
    return _DIR


def _reap_orphans() -> None:
    """Remove the sparse folders of processes that no longer run (each name holds its creator's pid)."""
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX) :].split("-", 1)[0]
        if not name.startswith(_PREFIX) or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
        except OSError:  # alive, and another user's
            pass


def sparse_empty(shape, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """A zero-filled tensor whose untouched pages take no memory (CPU), or torch.empty (CUDA)."""
    if torch.device(device).type != "cpu":
        return _device_empty(shape, dtype, torch.device(device))
    numel = math.prod(shape)
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    fd, path = tempfile.mkstemp(dir=_folder(), suffix=".bin")
    os.close(fd)
    flat = torch.from_file(path, shared=True, size=numel, dtype=dtype)
    ptr = flat.untyped_storage().data_ptr()
    _FILES[ptr] = (path, nbytes)

    def forget(ptr=ptr, path=path):
        _FILES.pop(ptr, None)
        try:
            os.unlink(path)
        except OSError:
            pass

    weakref.finalize(flat.untyped_storage(), forget)
    return flat.view(shape)


WAIT_FOR_MEMORY_S = 300.0  # how long a large case waits for another grading to give GPU memory back
MEMORY_MARGIN = 256 * 2**20  # left free for the kernel's own launch and the allocator's rounding


def _device_empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.empty on a GPU, for a buffer that may need most of its memory (several GiB): when another
    process (make check runs two gradings side by side) holds what it needs, wait for that memory to come
    back, and when it does not come back, skip the case with the sizes as its reason, instead of failing
    it with an out-of-memory error that says nothing about the kernel."""
    import time

    import pytest

    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    deadline = time.monotonic() + WAIT_FOR_MEMORY_S
    while True:
        free, total = torch.cuda.mem_get_info(device)
        if nbytes + MEMORY_MARGIN > total:
            pytest.skip(f"needs {nbytes / 2**30:.1f} GiB of GPU memory; this GPU has {total / 2**30:.1f} GiB")
        if nbytes + MEMORY_MARGIN <= free:
            try:
                return torch.empty(shape, dtype=dtype, device=device)
            except torch.cuda.OutOfMemoryError:  # taken by another process between the look and the ask
                pass
        if time.monotonic() > deadline:
            pytest.skip(
                f"needs {nbytes / 2**30:.1f} GiB of GPU memory and {free / 2**30:.1f} GiB stayed free for "
                f"{WAIT_FOR_MEMORY_S:.0f} s (another process holds the rest): grade this lesson alone"
            )
        torch.cuda.empty_cache()
        time.sleep(1.0)


RELEASE_ABOVE = 2**30  # cached GPU bytes past which a process gives its allocator's free blocks back


def release_device_cache() -> None:
    """After a check or a call: give the caching allocator's free GPU blocks back once they pass
    RELEASE_ABOVE. A large case's buffer stays reserved by the process that freed it, so a grading beside
    it (make check runs two, an instructor may run more) would wait in _device_empty for memory that no
    one uses. Does nothing in a process that never touched the GPU."""
    if not torch.cuda.is_initialized():
        return
    if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > RELEASE_ABOVE:
        gc.collect()  # tensors in reference cycles still hold their blocks
        torch.cuda.empty_cache()


def register(storage: torch.UntypedStorage, path: str, nbytes: int) -> None:
    """Record that `storage` maps `path` (the learner's process maps the grader's sparse files)."""
    ptr = storage.data_ptr()
    _FILES[ptr] = (path, nbytes)
    weakref.finalize(storage, _FILES.pop, ptr, None)


def backing_file(storage: torch.UntypedStorage) -> tuple[str, int] | None:
    """(path, nbytes) when `storage` came from sparse_empty, else None."""
    return _FILES.get(storage.data_ptr())


def free_bytes() -> int:
    """Bytes of memory available now (MemAvailable), for a skip reason when even the touched pages
    would not fit."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# Offsets past 2**31 elements: slices SLICE_STRIDE apart fit int32 one by one, but slice 2 does not.
SLICE_STRIDE = 2**30 + 2**20
WRAP = 2**32 - 2 * SLICE_STRIDE  # where an int32 2 * SLICE_STRIDE lands: this far before slice 0


def past_int32(slice_numel: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, int]:
    """(a buffer of zeros, WRAP) for three slices of slice_numel elements SLICE_STRIDE apart starting at
    element WRAP: slice 2 starts past element 2**31 of a view there, and where an int32 offset would put
    it (the buffer's first slice_numel elements) reads zeros instead of faulting. Sparse on the CPU."""
    flat = sparse_empty((WRAP + 2 * SLICE_STRIDE + slice_numel,), dtype, device)
    flat[:slice_numel].zero_()  # already zeros on the CPU; torch.empty on a GPU
    return flat, WRAP


def rows_past_int32(N: int, device, dtype: torch.dtype = torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    """A [3, N] view whose rows lie SLICE_STRIDE elements apart (row 2 past element 2**31), and its buffer."""
    flat, wrap = past_int32(N, dtype, device)
    return flat.as_strided((3, N), (SLICE_STRIDE, 1), wrap), flat
