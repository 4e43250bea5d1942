"""The offline wheelhouse: built where an index is reachable, installed where none is."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_a_wheelhouse_installs_without_an_index_including_source_only_packages(tmp_path):
    # connection_pool (a snakemake dependency) is published as source only, hjson as a wheel
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("connection_pool==0.0.3\nhjson==3.1.0\n")
    house = tmp_path / "wheels"
    subprocess.run([sys.executable, str(REPO / "tools/build_wheelhouse.py"), str(house), "--python", "3.12",
                    "--requirements", str(requirements), "--no-project"], check=True, timeout=600)
    assert sorted(p.name for p in house.iterdir()) == ["connection_pool-0.0.3-py3-none-any.whl",
                                                       "hjson-3.1.0-py3-none-any.whl"]
    venv = tmp_path / "offline"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
                    str(house), "-r", str(requirements)], check=True, timeout=300,
                   env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"})
    subprocess.run([str(venv / "bin/python"), "-c", "import connection_pool, hjson"], check=True)
