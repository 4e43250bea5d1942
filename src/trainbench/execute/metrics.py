"""Measurement inside a rank: the tensors a process holds and its peak resident memory. The figures
the timed windows give (throughput, TFLOPS, MFU) are the result contract's (contract.figures).
"""

from __future__ import annotations

import resource


def tensors_held_bytes(leave_out: set[int] = frozenset()) -> dict[str, int]:
    """Memory of every tensor this process still holds, by device type ("cpu", "cuda"), in bytes: each
    storage once, however many tensors view it. Counted from Python's garbage collector, so tensors held
    only inside C++ (autograd's saved tensors, DDP's buckets) are not in it. At the end of a run it is
    what a rank keeps between steps (parameters, gradients, optimizer states, buffers): a figure that
    CPU ranks can compare rank for rank, where they have no allocator statistics (emulated ranks against
    real ones, in the tests). `leave_out`: storages (by data pointer) not to count."""
    import gc
    import warnings

    import torch

    seen: set[tuple[str, int]] = set()
    held: dict[str, int] = {}
    with warnings.catch_warnings():  # isinstance() on torch.distributed's deprecated objects warns
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor) and not obj.is_meta]
    for obj in tensors:
        try:
            storage = obj.untyped_storage()
            pointer, size = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # a wrapper subclass (DTensor): its local tensor counts
            continue
        key = (obj.device.type, pointer)
        if pointer == 0 or key in seen or pointer in leave_out:
            continue
        seen.add(key)
        held[obj.device.type] = held.get(obj.device.type, 0) + size
    return dict(sorted(held.items()))


def process_peak_rss_mib() -> float:
    """Peak resident set of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
