"""The CPU kernel choices kept across processes (plugins/core/tuning_cache.h): where a direct kernel
(Winograd, depthwise) and oneDNN can both run a FusedConv, the choice timed at its first run goes to
$EPIFUSE_TUNING_CACHE when EPIFUSE_TUNE=1 (the optimizer's measuring process and `epifuse tune` set it),
and a kept choice decides the kernel in later processes, whichever it names."""
import os
import re
from pathlib import Path

import onnx
import pytest

from optimizer import registry
from optimizer.cli import main
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.registry import ConvDesc
from tests.helpers import conv_net

# a 3x3 that Winograd and oneDNN can both run
DESC = ConvDesc.from_attributes(registry.FLOAT, (1, 20, 20, 24), (24, 3, 3, 24), pads=(1, 1, 1, 1),
                                activation="relu")


def _auto_kernel() -> str:
    return registry.cpu_kernel_name(DESC, "auto")


def _entries(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []


def _tuned_entry(tmp_path, monkeypatch) -> tuple[str, str]:
    """(device, problem) of DESC's line in a cache tuned afresh; EPIFUSE_TUNE is left unset."""
    monkeypatch.setenv("EPIFUSE_TUNE", "1")
    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(tmp_path / "tuned.tsv"))
    _auto_kernel()
    ((device, problem, _),) = _entries(tmp_path / "tuned.tsv")
    monkeypatch.delenv("EPIFUSE_TUNE")
    return device, problem


def test_a_choice_is_written_only_where_tuning_is_enabled(tmp_path, monkeypatch):
    monkeypatch.delenv("EPIFUSE_TUNE", raising=False)
    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(tmp_path / "untuned.tsv"))
    _auto_kernel()
    assert not (tmp_path / "untuned.tsv").exists()

    monkeypatch.setenv("EPIFUSE_TUNE", "1")
    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(tmp_path / "tuned.tsv"))  # another file: read afresh
    chosen = _auto_kernel()
    ((device, problem, kernel),) = _entries(tmp_path / "tuned.tsv")
    assert re.fullmatch(r"cpu .+, \d+ threads, build [0-9a-f]{12}", device), device
    direct, dims = problem.split(" or onednn: ")
    assert direct.startswith("winograd") and dims.startswith("1 20 20 24 24 3 3 ")
    assert kernel in ("onednn", direct) and chosen.startswith(kernel)


@pytest.mark.parametrize("kept", ["onednn", "direct"])
def test_a_kept_choice_decides_the_kernel(kept, tmp_path, monkeypatch):
    """One of the two is the slower here, yet the kept choice runs either way: it decides, not a timing."""
    device, problem = _tuned_entry(tmp_path, monkeypatch)
    direct = problem.split(" or onednn: ")[0]
    choice = "onednn" if kept == "onednn" else direct
    forged = tmp_path / "kept.tsv"
    forged.write_text(f"{device}\t{problem}\tsomething else\n{device}\t{problem}\t{choice}\n")  # later lines win
    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(forged))
    name = _auto_kernel()
    assert name.startswith("onednn ") if kept == "onednn" else name == direct
    assert forged.read_text().count("\n") == 2  # read, not written


def test_an_unknown_choice_is_timed_again(tmp_path, monkeypatch):
    device, problem = _tuned_entry(tmp_path, monkeypatch)
    stale = tmp_path / "stale.tsv"
    stale.write_text(f"{device}\t{problem}\ta kernel this build does not have\n")
    monkeypatch.setenv("EPIFUSE_TUNE", "1")  # the new timing is written after the stale line
    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(stale))
    name = _auto_kernel()
    assert _entries(stale)[-1] == [device, problem, "onednn" if name.startswith("onednn") else name]


def test_a_choice_another_build_kept_is_timed_again(tmp_path, monkeypatch):
    """A kept choice holds for the kernels it timed: a later build's (a faster kernel, say) times anew."""
    device, problem = _tuned_entry(tmp_path, monkeypatch)
    other_build = re.sub(r"build [0-9a-f]{12}$", "build 000000000000", device)
    assert other_build != device
    old = tmp_path / "old.tsv"
    old.write_text(f"{other_build}\t{problem}\tsomething an older build had\n")
    monkeypatch.setenv("EPIFUSE_TUNE", "1")
    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(old))
    name = _auto_kernel()
    assert _entries(old)[-1] == [device, problem, "onednn" if name.startswith("onednn") else name]


def test_the_optimizers_measuring_process_keeps_the_choices_it_measured_with(tmp_path):
    """So the optimized model runs on this machine with the kernels its fusions were measured with.
    The measuring process started with the tests' tuning file (conftest.py)."""
    cache = Path(os.environ["EPIFUSE_TUNING_CACHE"])
    model = onnx.shape_inference.infer_shapes(
        conv_net(lambda g, x: g.op("Relu", [g.conv_bn(x, 8, 16, 3)]), channels=8, size=17))
    optimize_model(model, target="ort-cpu", policy=FusionPolicy(mode="auto", cache_path=str(tmp_path / "c.json")))
    assert any(" or onednn: 1 17 17 8 16 3 3 " in problem
               for _, problem, _ in _entries(cache))


def test_tune_keeps_a_cpu_models_choices(tmp_path, monkeypatch):
    model = conv_net(lambda g, x: g.op("Relu", [g.conv_bn(x, 8, 8, 3)]), channels=8, size=15)
    src, fused = tmp_path / "m.onnx", tmp_path / "m.epifuse.onnx"
    onnx.save(model, src)
    monkeypatch.setenv("EPIFUSE_FUSE", "always")
    assert main(["optimize", str(src), "-o", str(fused), "--target", "ort-cpu"]) == 0
    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(tmp_path / "tuning.tsv"))
    monkeypatch.delenv("EPIFUSE_TUNE", raising=False)
    assert main(["tune", str(fused), "--target", "ort-cpu"]) == 0
    assert any(" or onednn: 1 15 15 8 8 3 3 " in problem for _, problem, _ in _entries(tmp_path / "tuning.tsv"))
    assert "EPIFUSE_TUNE" not in os.environ


@pytest.mark.parametrize("kept", ["onednn", "direct"])
def test_choices_another_process_adds_later_are_read(kept, tmp_path, monkeypatch):
    """The optimizer's whole-model check runs in the main process, after its measuring process wrote."""
    device, problem = _tuned_entry(tmp_path, monkeypatch)
    shared = tmp_path / "shared.tsv"
    monkeypatch.setenv("EPIFUSE_TUNING_CACHE", str(shared))
    other = ConvDesc.from_attributes(registry.FLOAT, (1, 9, 9, 32), (32, 3, 3, 1), pads=(1, 1, 1, 1), group=32)
    registry.cpu_kernel_name(other, "auto")  # this process has read the (missing) file
    choice = "onednn" if kept == "onednn" else problem.split(" or onednn: ")[0]
    shared.write_text(f"{device}\t{problem}\t{choice}\n")
    name = _auto_kernel()
    assert name.startswith("onednn ") if kept == "onednn" else name == choice
