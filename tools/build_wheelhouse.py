#!/usr/bin/env python3
"""Build a folder of wheels that installs the pipeline where no package index is reachable (HPC
compute nodes, the GPU hosts): run it where pip reaches an index, copy the folder, install offline.

    python3 tools/build_wheelhouse.py DIR [--python 3.12] [--torch torch==2.13.0]

On the target:

    python -m pip install --no-index --find-links DIR -r envs/requirements.txt
    python -m pip install --no-index --no-deps DIR/trainbench-*.whl     (or -e . in a clone)

Where the target already has most packages (the GPU hosts' image: --skip envs/gpu-host-image.txt),
the wheelhouse holds only the rest; install it with tools/install_offline.sh DIR, which adds its
wheels without resolving against an index.

How: resolve envs/requirements.txt with pip's resolver, then fetch every resolved package except
torch and its CUDA wheels (the target has its own; --torch adds one) as a wheel for the target's
Python and manylinux x86_64. Packages published only as source (deepspeed, connection_pool) are
built here into wheels: right only for pure-Python packages, which is checked (py3-none-any).

Where the copy to the target is limited in size: --leave-out drops packages the runs there do without
(pulp, Snakemake's ILP scheduler, 16 MiB: tools/gpu-host-run.sh then schedules greedily; torchao, for
float8 cells alone), and --lzma recompresses every wheel's members with LZMA (pip reads any method
Python's zipfile reads; the members and RECORD are unchanged): a third smaller than deflate.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]


def requirements(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def provided_by_torch(name: str) -> bool:
    """torch and the CUDA wheels it pulls in: the target has them, or --torch fetches torch."""
    name = name.lower()
    return name == "torch" or name == "triton" or name.startswith("nvidia-")


def resolve(specs: list[str], work: Path) -> list[tuple[str, str]]:
    """(name, version) of everything the specs need, as pip resolves it here."""
    report = work / "report.json"
    subprocess.run([*PIP, "install", "--dry-run", "--ignore-installed", "--report", str(report), *specs],
                   check=True)
    items = json.loads(report.read_text())["install"]
    return [(i["metadata"]["name"], i["metadata"]["version"]) for i in items]


def fetch(name: str, version: str, dest: Path, python: str) -> str:
    target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
              *[arg for p in PLATFORMS for arg in ("--platform", p)]]
    spec = f"{name}=={version}"
    binary = subprocess.run([*PIP, "download", "--no-deps", *target, "-d", str(dest), spec],
                            capture_output=True, text=True)
    if binary.returncode == 0:
        return "wheel"
    subprocess.run([*PIP, "wheel", "--no-deps", "-w", str(dest), spec], check=True)
    built = [w for w in dest.glob("*.whl") if w.name.lower().startswith(name.lower().replace("-", "_") + "-")]
    if not built or not all(w.name.endswith("-none-any.whl") for w in built):
        raise SystemExit(f"{spec} has no wheel for cp{python} and does not build to a pure-Python wheel")
    return "built"


def recompress(wheel: Path) -> None:
    """The wheel with its members LZMA-compressed, in place."""
    packed = wheel.with_suffix(".lzma-tmp")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(packed, "w", zipfile.ZIP_LZMA) as target:
        for info in source.infolist():
            data = source.read(info)
            info.compress_type = zipfile.ZIP_LZMA
            target.writestr(info, data)
    packed.replace(wheel)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                        help="the target's Python version (default: this one)")
    parser.add_argument("--torch", metavar="SPEC", help="also fetch torch, e.g. torch==2.13.0")
    parser.add_argument("--requirements", type=Path, default=REPO / "envs/requirements.txt")
    parser.add_argument("--no-project", action="store_true", help="leave out the trainbench wheel")
    parser.add_argument("--skip", type=Path, metavar="FILE",
                        help="names the target already has, one a line (e.g. envs/gpu-host-image.txt)")
    parser.add_argument("--leave-out", metavar="NAMES", default="",
                        help="comma-separated packages to leave out (e.g. pulp,torchao)")
    parser.add_argument("--lzma", action="store_true", help="recompress the wheels with LZMA")
    args = parser.parse_args()
    args.dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        resolved = [(n, v) for n, v in resolve(requirements(args.requirements), Path(tmp))
                    if not provided_by_torch(n)]
    if args.skip:
        present = {normalise(n) for n in requirements(args.skip)}
        resolved = [(n, v) for n, v in resolved if normalise(n) not in present]
    left_out = {normalise(n) for n in args.leave_out.split(",") if n.strip()}
    resolved = [(n, v) for n, v in resolved if normalise(n) not in left_out]
    print(f"{len(resolved)} packages for cp{args.python.replace('.', '')}")
    kinds = {"wheel": 0, "built": 0}
    for name, version in resolved:
        kinds[fetch(name, version, args.dest, args.python)] += 1
    if args.torch:
        fetch("torch", args.torch.split("==")[1], args.dest, args.python)
    if not args.no_project:
        # from a copy: setuptools would leave build/ and *.egg-info in the checkout
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("pyproject.toml", "README.md", "src"):
                source = REPO / name
                (shutil.copytree if source.is_dir() else shutil.copy)(source, Path(tmp) / name)
            subprocess.run([*PIP, "wheel", "--no-deps", "-w", str(args.dest.resolve()), tmp], check=True)
    wheels = sorted(args.dest.glob("*.whl"))
    if args.lzma:
        for wheel in wheels:
            recompress(wheel)
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"wheelhouse {args.dest}: {len(wheels)} wheels, {size:.0f} MiB "
          f"({kinds['wheel']} downloaded, {kinds['built']} built from source)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
