"""The hardware trainbench knows by name: one table of GPU types with every fact the memory model, the
time model and MFU use (memory, dense peak FLOP/s per precision, memory and link bandwidths), and the
node they typically sit in. Edit GPUS to add a GPU or correct a figure; everything else reads it.

Sources and assumptions (data sheets; "per direction" is half the bidirectional figure vendors quote):

- memory: what NVML reports as the total (MiB), which is what a run's measured peak is held against.
- peaks: dense tensor-core FLOP/s (not 2:4 sparse) for bf16/fp16/tf32/fp8; fp32 is the CUDA cores'
  figure (torch's default for fp32 matmuls: TF32 off). None: the GPU has no such format (FP8 tensor
  cores came with compute capability 8.9: Ada's L40S 733 TFLOPS, Hopper's 1,979).
- hbm_gb_s: device memory bandwidth (GB/s).
- nvlink_gb_s: NVLink bandwidth of one GPU, per direction (GB/s): NVLink 4 (H100/H200 SXM) 18 links x
  25 GB/s = 450; NVLink 3 (A100 SXM) 300; NVLink 2 (V100 SXM2) 150. None: no NVLink, peers talk over
  PCIe (through the host's root complex or a PCIe switch) at pcie_gb_s.
- pcie_gb_s: the GPU's host link, per direction (GB/s): PCIe Gen5 x16 64, Gen4 x16 32, Gen3 x16 16.
  Offloaded optimizer states and parameters cross it.
- network_gb_s: the inter-node network per GPU, per direction (GB/s), of the node the GPU typically
  sits in: HGX/DGX H100 and H200 nodes have one 400 Gb/s InfiniBand NDR (or RoCE) NIC per GPU = 50 GB/s;
  DGX A100 one 200 Gb/s HDR NIC per GPU = 25; V100 nodes 100 Gb/s EDR per GPU = 12.5; PCIe cards (L40S,
  A10) one 200 or 100 Gb/s NIC per two GPUs. A collective that spans nodes crosses each node's boundary
  on the cards of its ranks there: this figure times those ranks (predict.communication.link_gb_s).
  An assumption: clusters differ (2 or 4 NICs per node are common for inference nodes); change it here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MIB = 1024 * 1024  # bytes in a MiB: memory figures are MiB throughout


def host_memory_mib() -> float:
    """This host's physical memory in MiB: what psutil.virtual_memory().total says (the kernel's
    total RAM), without importing psutil (10 ms of each cell runner's start)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):  # no such sysconf names here (Windows)
        import psutil

        return psutil.virtual_memory().total / 2**20


@dataclass(frozen=True)
class GpuType:
    key: str  # the name on the command line: `trainbench predict --gpu h200`
    name: str  # what it is
    nvml: tuple[str, ...]  # substrings NVML's device name has (all of them), to recognise a run's GPU
    memory_mib: float
    peak_flops: dict[str, float | None]  # by compute type: bf16, fp16, tf32, fp32, fp8
    hbm_gb_s: float
    nvlink_gb_s: float | None
    pcie_gb_s: float
    network_gb_s: float
    nvml_excludes: tuple[str, ...] = ()  # NVML names with these are another part (H100 PCIe)

    def peer_gb_s(self) -> float:
        """Bandwidth between two GPUs of one node, per direction: NVLink, or PCIe without it."""
        return self.nvlink_gb_s or self.pcie_gb_s


# fp8: the FP8 tensor cores' dense peak (float8 cells' second MFU); None where a GPU has none
_HOPPER = {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12, "fp8": 1979e12}
_AMPERE = {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12, "fp8": None}
_VOLTA = {"bf16": None, "fp16": 125e12, "tf32": 15.7e12, "fp32": 15.7e12, "fp8": None}  # no TF32: fp32 runs

# Order matters for recognising NVML names: the first entry whose substrings all appear wins
# ("A100-SXM4-80GB" is an a100-80g before it is an a100-40g; "A100" before "A10").
GPUS: dict[str, GpuType] = {g.key: g for g in (
    GpuType("h100", "NVIDIA H100 SXM 80 GB", ("H100",), 81559.0, _HOPPER, 3350, 450, 64, 50,
            nvml_excludes=("PCIe",)),  # the PCIe part has lower peaks: better no figure than a wrong one
    GpuType("h200", "NVIDIA H200 SXM 141 GB", ("H200",), 143771.0, _HOPPER, 4800, 450, 64, 50),
    GpuType("a100-80g", "NVIDIA A100 SXM 80 GB", ("A100", "80GB"), 81920.0, _AMPERE, 2039, 300, 32, 25),
    GpuType("a100-40g", "NVIDIA A100 SXM 40 GB", ("A100",), 40960.0, _AMPERE, 1555, 300, 32, 25),
    GpuType("v100-32g", "NVIDIA V100 SXM2 32 GB", ("V100", "32GB"), 32768.0, _VOLTA, 900, 150, 16, 12.5),
    GpuType("v100-16g", "NVIDIA V100 SXM2 16 GB", ("V100",), 16384.0, _VOLTA, 900, 150, 16, 12.5),
    GpuType("l40s", "NVIDIA L40S 48 GB (PCIe, no NVLink)", ("L40S",), 46068.0,
            {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12, "fp8": 733e12}, 864, None, 32,
            12.5),
    GpuType("a10", "NVIDIA A10 24 GB (PCIe, no NVLink)", ("A10",), 23028.0,
            {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12, "fp8": None}, 600, None, 32,
            6.25),
)}


def gpu_type(key: str) -> GpuType:
    """A GPU type by its command-line name (case-insensitive); ValueError naming the known ones."""
    found = GPUS.get(key.lower())
    if found is None:
        raise ValueError(f"unknown GPU {key!r}; known: {', '.join(GPUS)}")
    return found


def gpu_type_of(nvml_name: str | None) -> GpuType | None:
    """The GPU type of a device as NVML names it ("NVIDIA H200"); None for CPUs and unknown parts."""
    if not nvml_name:
        return None
    for gpu in GPUS.values():
        if all(s in nvml_name for s in gpu.nvml) and not any(s in nvml_name for s in gpu.nvml_excludes):
            return gpu
    return None


def gpu_model_of(nvml_name: str | None) -> str | None:
    """What a run's GPU is, for telling runs' hardware apart: its GPU type's key ("h200"), or NVML's own
    name for a part this table does not know (an H100 PCIe is not an H100 SXM); None: no GPU."""
    gpu = gpu_type_of(nvml_name)
    return gpu.key if gpu else (nvml_name or None)


def gpu_label(nvml_name: str | None) -> str:
    """A run's GPU as reports name it: H200, H100, NVML's name of a part this table does not know, or
    "no GPU"."""
    gpu = gpu_type_of(nvml_name)
    if gpu is not None:
        return gpu.key.upper()
    return nvml_name.removeprefix("NVIDIA ").strip() if nvml_name else "no GPU"


def gpu_type_named_in(text: str | None) -> GpuType | None:
    """The GPU type a free-text hardware name mentions ("8 x H200 per node"), case-insensitive; None if
    none does."""
    if not text:
        return None
    upper = text.upper()
    for gpu in GPUS.values():
        if (all(s.upper() in upper for s in gpu.nvml)
                and not any(s.upper() in upper for s in gpu.nvml_excludes)):
            return gpu
    return None


def compute_type(precision: str, tf32: bool) -> str:
    """Which peak a cell's matmuls run against: its half precision, or TF32/fp32 for fp32 cells."""
    if precision in ("bf16", "fp16"):
        return precision
    return "tf32" if tf32 else "fp32"


def peak_flops(gpu: GpuType | None, precision: str, tf32: bool) -> float | None:
    """Dense peak FLOP/s of one GPU for a cell's precision; None without a GPU or without the format."""
    return peak_flops_of(gpu, compute_type(precision, tf32))


def peak_flops_of(gpu: GpuType | None, kind: str) -> float | None:
    """Dense peak FLOP/s of one GPU in a compute type (bf16, fp16, tf32, fp32, fp8); None without."""
    return None if gpu is None else gpu.peak_flops.get(kind)
