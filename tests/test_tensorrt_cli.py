"""optimizer/tensorrt.py without TensorRT: shape options, profile rules, and the error when
TensorRT is missing. Engine builds are in test_tensorrt_build.py (marker trt_build)."""
from __future__ import annotations

import sys

import pytest

from optimizer import cli, tensorrt
from optimizer.errors import EpifuseError


def test_parse_shapes():
    assert tensorrt.parse_shapes("input:1x3x224x224,mask:4") == {"input": (1, 3, 224, 224), "mask": (4,)}
    assert tensorrt.parse_shapes("ns/x:0:2x8") == {"ns/x:0": (2, 8)}
    assert tensorrt.parse_shapes(None) == {}
    for bad in ("input", "input:1x", "input:ax3"):
        with pytest.raises(EpifuseError, match="bad shape"):
            tensorrt.parse_shapes(bad)


INPUTS = {"x": (-1, 3, 64, 64), "fixed": (1, 4)}


def test_profile_defaults_to_opt():
    p = tensorrt._profile_shapes(INPUTS, {"x": (1, 3, 64, 64)}, {"x": (2, 3, 64, 64)}, {})
    assert p == {"x": ((1, 3, 64, 64), (2, 3, 64, 64), (2, 3, 64, 64))}


@pytest.mark.parametrize("lo, opt, hi, message", [
    ({}, {}, {}, "input 'x' has dynamic shape (-1, 3, 64, 64): give its shapes with --min/--opt/--max x:1x3x64x64"),
    ({"y": (1,)}, {}, {}, "--min/--opt/--max name input 'y'"),
    ({"x": (1, 3, 32, 64)}, {}, {}, "does not fit input 'x'"),
    ({"x": (4, 3, 64, 64)}, {"x": (2, 3, 64, 64)}, {}, "need min <= opt <= max"),
    ({"fixed": (2, 4)}, {"x": (1, 3, 64, 64)}, {}, "input 'fixed' has the fixed shape (1, 4)"),
])
def test_profile_errors(lo, opt, hi, message):
    with pytest.raises(EpifuseError) as e:
        tensorrt._profile_shapes(INPUTS, lo, opt, hi)
    assert message in str(e.value)


def test_missing_tensorrt_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # None in sys.modules makes the import fail
    monkeypatch.setitem(sys.modules, "tensorrt_rtx_bindings", None)
    with pytest.raises(EpifuseError, match="TensorRT's Python API is not installed"):
        tensorrt.load_tensorrt()
    assert cli.main(["build-engine", str(tmp_path / "m.onnx")]) == 2
    assert "TensorRT's Python API is not installed" in capsys.readouterr().err


def test_a_folder_named_tensorrt_on_the_path_is_not_tensorrt(monkeypatch, tmp_path):
    """A checkout's `tensorrt/` folder on sys.path imports as an empty namespace package (pytest put the
    tests' own one there): it must not pass for TensorRT's Python API."""
    import types

    for name in ("tensorrt", "tensorrt_rtx_bindings"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))  # what such a folder imports as
    with pytest.raises(EpifuseError, match="TensorRT's Python API is not installed"):
        tensorrt.load_tensorrt()


def test_bench_tensorrt_without_a_runtime_is_a_clear_error(tmp_path, capsys):
    """Running a plan needs TensorRT's runtime and a GPU; where either is missing: exit 2, one line."""
    from optimizer.cli import main

    plan = tmp_path / "m.plan"
    plan.write_bytes(b"not a plan")
    assert main(["bench", str(plan), "--backend", "tensorrt", "--runs", "1", "--warmup", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("epifuse: error:")
    assert any(word in err[0] for word in ("TensorRT", "GPU", "torch", "deserialize"))


def test_the_plugins_engine_is_kept_only_where_clearly_faster():
    from optimizer.tensorrt.faster import MARGIN, faster

    assert faster({"epifuse": [1.0, 0.9, 1.1], "tensorrt": [1.2, 1.3, 1.2]}) == "epifuse"
    assert faster({"epifuse": [1.0] * 3, "tensorrt": [1.0] * 3}) == "tensorrt"  # a tie: TensorRT's own
    assert faster({"epifuse": [MARGIN * 1.001] * 3, "tensorrt": [1.0] * 3}) == "tensorrt"
    assert faster({"epifuse": [0.5, 3.0, 0.5], "tensorrt": [0.6, 0.6, 0.6]}) == "epifuse"  # medians, not means


def test_engines_are_timed_in_interleaved_rounds():
    """build-engine --original times the two engines with compare's interleaved rounds."""
    from optimizer.compare import interleaved
    from optimizer.tensorrt.faster import _timed

    now, order = [0.0], []

    def runner(name, seconds):
        def run():
            order.append(name)
            now[0] += seconds
        return run

    def clock():
        return now[0]

    times = interleaved([_timed(runner("e", 0.004), clock), _timed(runner("t", 0.005), clock)], rounds=4, warmup=3)
    assert times == [pytest.approx([4.0] * 4), pytest.approx([5.0] * 4)]
    timed = order[8:]  # after 3 warm-up runs each and one probe of each
    calls = len(timed) // 8  # about ROUND_SECONDS (20 ms) of the faster engine's 4 ms a call
    assert calls in (4, 5) and len(timed) == 8 * calls
    assert timed == [name for block in "etteette" for name in [block] * calls]  # the order alternates each round


def test_build_engine_original_names_a_bad_original_before_building(tmp_path, capsys):
    bad = tmp_path / "orig.onnx"
    bad.write_bytes(b"not a model")
    assert cli.main(["build-engine", str(tmp_path / "m.onnx"), "--original", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "orig.onnx" in err and "not an ONNX model" in err


def test_build_engine_original_reads_the_precision_from_the_model_and_refuses_a_mismatch(tmp_path, capsys):
    import onnx

    from models import zoo
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.tensorrt.cli import _model_precision

    original = zoo.build("resnet_tiny", batch=1)
    onnx.save(original, tmp_path / "orig.onnx")
    for precision in ("fp32", "fp16"):
        optimized, _ = optimize_model(original, target="tensorrt", precision=precision,
                                      policy=FusionPolicy(mode="always"))
        onnx.save(optimized, tmp_path / f"{precision}.onnx")
        assert _model_precision(str(tmp_path / f"{precision}.onnx")) == precision
    assert _model_precision(str(tmp_path / "orig.onnx")) is None
    assert cli.main(["build-engine", str(tmp_path / "fp16.onnx"), "-o", str(tmp_path / "m.plan"),
                     "--original", str(tmp_path / "orig.onnx"), "--precision", "fp32"]) == 2
    assert "its FusedConv filters are fp16" in capsys.readouterr().err
    assert cli.main(["build-engine", str(tmp_path / "fp16.onnx"), "-o", str(tmp_path / "orig.onnx"),
                     "--original", str(tmp_path / "orig.onnx")]) == 2
    assert "would overwrite a model" in capsys.readouterr().err
    assert onnx.load(tmp_path / "orig.onnx") == original
