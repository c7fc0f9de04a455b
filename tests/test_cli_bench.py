"""`epifuse bench` on the CPU EP (the CUDA EP and `epifuse tune` run in tests/test_ort_cuda.py)."""
import json
import os

import onnx

from models import zoo
from optimizer.cli import main


def test_bench_reports_latency_and_throughput(tmp_path, capsys):
    src, out, report = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(zoo.build("mobilenetv3_tiny"), src)
    assert main(["optimize", str(src), "-o", str(out)]) == 0
    assert main(["bench", str(out), "--backend", "ort-cpu", "--batch", "3", "--runs", "5", "--warmup", "1",
                 "--report", str(report)]) == 0
    result = json.loads(report.read_text())
    assert result["batch"] == 3 and result["runs"] == 5
    assert 0 < result["min_ms"] <= result["median_ms"] <= result["p90_ms"] <= result["p99_ms"]
    assert result["throughput_per_s"] > 0
    assert "median ms" in capsys.readouterr().out


def test_bench_fp16_optimizes_in_memory(tmp_path):
    src, report = tmp_path / "m.onnx", tmp_path / "r.json"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["bench", str(src), "--backend", "ort-cpu", "--fp16", "--runs", "3", "--warmup", "1",
                 "--report", str(report)]) == 0
    assert json.loads(report.read_text())["fp16"] is True


def test_bench_missing_file(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "nope.onnx"), "--backend", "ort-cpu"]) == 2


def test_bench_prefer_nhwc_is_refused_off_the_cuda_ep(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["bench", str(src), "--backend", "ort-cpu", "--prefer-nhwc"]) == 2
    assert "--prefer-nhwc applies to --backend ort-cuda" in capsys.readouterr().err


def test_tuning_block_restores_the_callers_setting(monkeypatch):
    """A process run with EPIFUSE_TUNE=1 keeps it after a tuning run, so the fusion decisions that follow
    time tuned kernels; a process without it gets none back."""
    from optimizer.bench import tuning

    monkeypatch.setenv("EPIFUSE_TUNE", "1")
    with tuning():
        assert os.environ["EPIFUSE_TUNE"] == "1"
    assert os.environ.get("EPIFUSE_TUNE") == "1"
    monkeypatch.delenv("EPIFUSE_TUNE")
    with tuning():
        assert os.environ["EPIFUSE_TUNE"] == "1"
    assert "EPIFUSE_TUNE" not in os.environ
