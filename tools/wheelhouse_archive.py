#!/usr/bin/env python3
"""A wheelhouse as one small file, for a machine reached only by copying files with a size limit.

Wheels are zip files, each compressed on its own; their contents unpacked and compressed together
with xz take about two thirds of the room (the GPU hosts' wheelhouse: 13.0 MB of wheels, 8.2 MB packed).

    python3 tools/wheelhouse_archive.py pack WHEELHOUSE ARCHIVE.tar.xz
    python3 tools/wheelhouse_archive.py unpack ARCHIVE.tar.xz WHEELHOUSE   (the wheels again)

A re-made wheel holds the same files as the original, so pip's check of each file against the wheel's
RECORD passes; only the zip around them differs.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path


def pack(wheelhouse: Path, archive: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive, "w:xz", preset=9) as tar:
        for wheel in sorted(wheelhouse.glob("*.whl")):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(Path(tmp) / wheel.name)
            tar.add(Path(tmp) / wheel.name, arcname=wheel.name)


def unpack(archive: Path, wheelhouse: Path) -> None:
    wheelhouse.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        for folder in sorted(Path(tmp).iterdir()):
            with zipfile.ZipFile(wheelhouse / folder.name, "w", zipfile.ZIP_DEFLATED) as z:
                for path in sorted(folder.rglob("*")):
                    if path.is_file():
                        z.write(path, path.relative_to(folder).as_posix())


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        sys.exit(__doc__)
    (pack if sys.argv[1] == "pack" else unpack)(Path(sys.argv[2]), Path(sys.argv[3]))
