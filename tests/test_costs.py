"""Costs files: measured on one machine (`epifuse tune --export-costs`), read on another (`epifuse
optimize --costs`), giving the same decisions; their format, errors and atomic writes."""
import json
import os
import stat

import onnx
import pytest

from models import zoo
from optimizer import contract
from optimizer.cli import main
from optimizer.costs import COSTS_FORMAT, CostTable, FileCosts
from optimizer.errors import EpifuseError
from optimizer.pipeline import FusionPolicy, optimize_model
from tests.test_decide import FakeTimer, _chain


def _decisions(report):
    return [(d.node, d.fused, d.ours_us, d.runtime_us) for d in report.decisions]


def _fused_nodes(model):
    return [(n.name, [(a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute])
            for n in model.graph.node if n.op_type == contract.OP_TYPE]


def test_costs_exported_on_one_machine_give_the_same_decisions_on_another(tmp_path):
    model, names = _chain(3, pool_between=True, batch="N")
    times = {names[0]: (10.0, 20.0), names[1]: (30.0, 20.0), names[2]: lambda n: (5.0, 9.0) if n == 1 else (50.0, 40.0)}
    export = tmp_path / "h200.json"
    # the "GPU machine": measures (a fake timer), exports
    on_target, measured = optimize_model(model, target="ort-cuda", precision="fp16", policy=FusionPolicy(
        mode="auto", timer=FakeTimer(times), batches=(1, 16), cache_path=str(tmp_path / "a-cache.json"),
        export_costs=str(export)))
    # the "build machine": no timer at all, only the file
    elsewhere, from_file = optimize_model(model, target="ort-cuda", precision="fp16", policy=FusionPolicy(
        mode="auto", costs_file=str(export), batches=(1, 16)))
    assert _decisions(from_file) == _decisions(measured)
    assert [d.fused for d in from_file.decisions] == [True, False, False]
    assert _fused_nodes(elsewhere) == _fused_nodes(on_target)
    assert all(d.source == "costs file (fake accelerator)" for d in from_file.decisions)
    data = json.loads(export.read_text())
    assert data["format"] == COSTS_FORMAT
    keys = {m["key"] for m in data["measurements"]}
    assert len([k for k in keys if not k.startswith("Transpose")]) == 6  # 3 candidates x 2 batch sizes
    assert all(m["device"] == "fake accelerator" and m["library"] == "fake runtime 1.0" for m in data["measurements"])


def test_a_costs_file_without_a_candidate_leaves_it_to_the_static_policy(tmp_path):
    path = tmp_path / "empty.json"
    CostTable({("dev", "lib", "Transpose|fp16|x1x8x8x8"): {"runtime_us": 1.0}}).save(path)
    model, names = _chain(1)
    _, report = optimize_model(model, target="ort-cuda", precision="fp16",
                               policy=FusionPolicy(mode="auto", costs_file=str(path)))
    assert report.decisions[0].source == "static policy"
    assert f"not in {path}" in report.decisions[0].reason


@pytest.mark.parametrize("content, message", [
    ("{not json", "cannot read costs file"),
    ('{"format": "something else"}', "not an epifuse costs file"),
    (json.dumps({"format": COSTS_FORMAT, "measurements": [{"device": "d"}]}), "measurement 0 lacks"),
])
def test_bad_costs_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(EpifuseError, match=message):
        FileCosts(str(path))


def test_a_costs_file_of_several_devices_needs_one_named(tmp_path):
    path = tmp_path / "two.json"
    CostTable({("A100", "lib", "k"): {"ours_us": 1.0, "runtime_us": 2.0},
               ("H200", "lib", "k"): {"ours_us": 3.0, "runtime_us": 2.0}}).save(path)
    with pytest.raises(EpifuseError, match="several devices"):
        FileCosts(str(path))
    assert FileCosts(str(path), "H200").by_key == {"k": {"ours_us": 3.0, "runtime_us": 2.0}}
    with pytest.raises(EpifuseError, match="no measurements of device 'L4'"):
        FileCosts(str(path), "L4")


def test_costs_files_are_written_atomically_with_the_umask(tmp_path):
    path = tmp_path / "c.json"
    old = os.umask(0o027)
    try:
        CostTable({("d", "l", "k"): {"ours_us": 1.0, "runtime_us": 2.0}}).save(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["c.json"]
    with pytest.raises(EpifuseError, match="folder does not exist"):
        CostTable().save(tmp_path / "missing" / "c.json")


def test_cli_round_trip_on_this_machine(tmp_path, capsys):
    """Really measured (ONNX Runtime's CPU EP here), exported, then read back by optimize."""
    src, costs, out = tmp_path / "m.onnx", tmp_path / "cpu-costs.json", tmp_path / "o.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    env_cache = tmp_path / "cache.json"
    os.environ["EPIFUSE_COSTS_CACHE"] = str(env_cache)
    try:
        assert main(["tune", str(src), "--target", "ort-cpu", "--precision", "fp32", "--export-costs", str(costs)]) == 0
        exported = CostTable.load(costs)
        assert exported.entries and all(v["ours_us"] > 0 and v["runtime_us"] > 0
                                        for (_, _, k), v in exported.entries.items() if not k.startswith("Transpose"))
        assert main(["optimize", str(src), "-o", str(out), "--fuse", "auto", "--costs", str(costs),
                     "--report", str(tmp_path / "r.json")]) == 0
    finally:
        del os.environ["EPIFUSE_COSTS_CACHE"]
    report = json.loads((tmp_path / "r.json").read_text())
    convs = sum(1 for n in onnx.load(src).graph.node if n.op_type == "Conv")
    assert len(report["decisions"]) == convs
    assert all(d["source"].startswith("costs file") and d["ours_us"] and d["runtime_us"] for d in report["decisions"])
    assert all(d["fused"] == (d["ours_us"][0] < 0.95 * d["runtime_us"][0]) or "region" in d["reason"]
               for d in report["decisions"])
    assert "costs file" in report["costs"]


def test_export_costs_refuses_an_optimized_model(tmp_path, capsys):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["optimize", str(src), "-o", str(out), "--fuse", "always"]) == 0
    assert main(["tune", str(out), "--target", "ort-cpu", "--export-costs", str(tmp_path / "c.json")]) == 2
    assert "already optimized" in capsys.readouterr().err


def test_export_costs_needs_measuring_here(tmp_path):
    model, _ = _chain(1)
    with pytest.raises(EpifuseError, match="--export-costs needs measuring"):
        optimize_model(model, target="tensorrt", policy=FusionPolicy(mode="auto", export_costs=str(tmp_path / "c.json")))
    assert not (tmp_path / "c.json").exists()


def test_an_ort_cpu_costs_file_carries_the_reorder_times_and_gives_the_same_decisions(tmp_path):
    """On ort-cpu a costs file keeps each group's reorder times; the reading machine finds where the
    model reorders with its own ONNX Runtime (the target's), as the measuring machine did."""
    from optimizer.measure import OrtCpuTimer
    from tests.test_decide import ReorderTimer

    model, (a, b) = _chain(2, pool_between=True)
    times, reorders = {a: (104.0, 100.0), b: (300.0, 100.0)}, {a: (5.0, 6.0), b: (7.0, 8.0)}
    probe = ReorderTimer(times, reorders)
    optimize_model(model, target="ort-cpu", policy=FusionPolicy(mode="auto", timer=probe, model_check=False,
                                                                cache_path=str(tmp_path / "probe.json")))
    reader = OrtCpuTimer()
    try:
        real = reader.reordered_tensors(probe.models[0].SerializeToString())  # what ORT here says of it
    finally:
        reader.close()
    export = tmp_path / "cpu.json"
    _, measured = optimize_model(model, target="ort-cpu", policy=FusionPolicy(
        mode="auto", timer=ReorderTimer(times, reorders, real), model_check=False,
        cache_path=str(tmp_path / "a-cache.json"), export_costs=str(export)))
    rows = [m for m in json.loads(export.read_text())["measurements"] if not m["key"].startswith("Transpose")]
    assert sorted((m["reorder_in_us"], m["reorder_out_us"]) for m in rows) == [(5.0, 6.0), (7.0, 8.0)]
    _, from_file = optimize_model(model, target="ort-cpu", policy=FusionPolicy(
        mode="auto", costs_file=str(export), model_check=False))
    assert _decisions(from_file) == _decisions(measured)
    assert [d.runtime_us for d in from_file.decisions] != [[100.0], [100.0]]  # ORT reorders the model's input
