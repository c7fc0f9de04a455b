"""`epifuse compare` and `optimize --bench`: interleaved timing in one process, the speed-up with its
spread, and --require-faster. The verdict logic runs on fake runners with fixed durations; the CLI
runs the real thing on a small model (its figures are checked for shape, not for speed)."""
import json

import onnx
import pytest

from models import zoo
from optimizer import compare as compare_module
from optimizer.cli import main
from optimizer.compare import compare
from optimizer.errors import EpifuseError


class _Fixed:
    """A runner whose calls take a fixed time (seconds), recording the order it was called in."""

    def __init__(self, seconds, log, label):
        self.seconds, self.log, self.label = seconds, log, label

    def __call__(self):
        self.log.append(self.label)
        return self.seconds


@pytest.fixture
def fake_runners(monkeypatch):
    """Replaces the ORT runners: the original takes `times[0]`, the optimized `times[1]` seconds per call."""
    state = {"times": (1e-3, 1e-3), "log": []}

    def runners(model, feeds, backend, threads=None, spinning=False):
        side = 0 if runners.calls % 2 == 0 else 1
        runners.calls += 1
        return [_Fixed(state["times"][side], state["log"], side)]

    runners.calls = 0
    monkeypatch.setattr(compare_module, "_runners", runners)
    return state


def _model():
    return onnx.shape_inference.infer_shapes(zoo.build("resnet_tiny", batch=1))


@pytest.mark.parametrize("times, speedup, slower", [((2e-3, 1e-3), 2.0, False), ((1e-3, 1.25e-3), 0.8, True),
                                                    ((1e-3, 1e-3), 1.0, False)])
def test_speedup_and_verdict(fake_runners, times, speedup, slower):
    fake_runners["times"] = times
    result = compare(_model(), _model(), backend="ort-cpu", rounds=8, warmup=1)
    assert result["speedup"] == pytest.approx(speedup)
    assert result["slower"] is slower
    assert result["speedup_q1"] <= result["speedup"] <= result["speedup_q3"]
    assert result["original_ms"] == pytest.approx(times[0] * 1e3)


def test_rounds_alternate_which_model_runs_first(fake_runners):
    compare(_model(), _model(), backend="ort-cpu", rounds=4, warmup=0)
    log = fake_runners["log"]
    calls = len(log) // 4 // 2  # calls per side per round, after the calibration call of each side
    timed = log[-4 * 2 * calls:]
    firsts = [timed[i * 2 * calls] for i in range(4)]
    assert firsts == [0, 1, 0, 1]


class _Noisy:
    """A configuration `seconds` per call on average, each call off by up to 8% at random (host jitter)."""

    def __init__(self, seconds, rng):
        self.seconds, self.rng = seconds, rng

    def __call__(self):
        return self.seconds * (1 + self.rng.uniform(-0.08, 0.08))


def test_the_best_configuration_is_chosen_despite_jitter():
    """Two configurations 3% apart under 8% jitter per call: the faster one, every time (three single
    runs each chose the slower one in one try in four)."""
    import random

    rng = random.Random(0)
    for _ in range(40):
        fast, slow = _Noisy(1e-3, rng), _Noisy(1.03e-3, rng)
        assert compare_module._best([slow, fast], warmup=1) is fast
        assert compare_module._best([fast, slow], warmup=1) is fast


def test_compare_refuses_too_few_rounds_and_other_backends():
    from optimizer.errors import EpifuseError

    with pytest.raises(EpifuseError, match="at least 2"):
        compare(_model(), _model(), backend="ort-cpu", rounds=1)
    with pytest.raises(EpifuseError, match="ort-cpu or ort-cuda"):
        compare(_model(), _model(), backend="tensorrt")


def test_cli_compare_prints_the_speedup_and_writes_json(tmp_path, capsys):
    src, out, report = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["optimize", str(src), "-o", str(out), "--fuse", "always"]) == 0
    assert main(["compare", str(src), str(out), "--backend", "ort-cpu", "--runs", "4", "--report", str(report)]) == 0
    text = capsys.readouterr().out
    assert "speed-up" in text and "interleaved rounds" in text
    result = json.loads(report.read_text())
    assert result["backend"] == "ort-cpu" and result["rounds"] == 4 and result["original_ms"] > 0


def test_cli_compare_by_op_says_where_each_models_time_goes(tmp_path, capsys):
    src, out, report = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["optimize", str(src), "-o", str(out), "--fuse", "always", "--target", "ort-cpu"]) == 0
    assert main(["compare", str(src), str(out), "--backend", "ort-cpu", "--runs", "2", "--by-op",
                 "--report", str(report)]) == 0
    original, optimized = (json.loads(report.read_text())["by_op_ms"][side] for side in ("original", "optimized"))
    assert original["Conv"] > 0 and "FusedConv" not in original
    assert optimized["FusedConv"] > 0 and "Conv" not in optimized
    assert all(ms > 0 for ms in (*original.values(), *optimized.values()))
    text = capsys.readouterr().out
    assert "FusedConv" in text and "total" in text


def test_cli_compare_by_op_needs_the_cpu(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["compare", str(src), str(src), "--backend", "ort-cuda", "--by-op"]) == 2
    captured = capsys.readouterr()
    assert "--by-op" in captured.err + captured.out


def test_compare_runs_the_cpu_on_the_threads_asked_for():
    model = zoo.build("resnet_tiny", batch=1)
    result = compare(model, model, backend="ort-cpu", rounds=2, threads=1)
    assert result["threads"] == 1
    runner = compare_module._CpuRunner(model, {}, threads=1)
    assert runner.session.get_session_options().intra_op_num_threads == 1
    with pytest.raises(EpifuseError, match="ort-cpu"):
        compare(model, model, backend="ort-cuda", threads=1)


def test_spinning_rounds_settle_untimed_then_time(fake_runners, monkeypatch):
    """With spinning pools each round first runs the side untimed (while the other side's pool spins down),
    then times it for the round's length; sides still alternate which goes first."""
    monkeypatch.setattr(compare_module, "SPINNING_ROUND_SECONDS", 0.008)
    monkeypatch.setattr(compare_module, "SPINNING_SETTLE_SECONDS", 0.004)
    fake_runners["times"] = (2e-3, 1e-3)
    result = compare(_model(), _model(), backend="ort-cpu", rounds=4, warmup=0, spinning=True)
    assert result["spinning"] and result["speedup"] == pytest.approx(2.0)
    log = fake_runners["log"]
    per_round = 4 + 8  # settle 4 ms and 8 ms timed, at the faster side's 1 ms a call
    rounds = log[-4 * 2 * per_round:]
    blocks = [rounds[i:i + per_round] for i in range(0, len(rounds), per_round)]
    assert all(len(set(b)) == 1 for b in blocks)  # each side's settle and timed calls run together
    assert [b[0] for b in blocks] == [0, 1, 1, 0, 0, 1, 1, 0]


@pytest.mark.parametrize("spinning, per_round", [(False, 6), (True, 4 + 6)])
def test_round_seconds_set_each_sides_time_in_a_round(fake_runners, monkeypatch, spinning, per_round):
    """`round_seconds` replaces the mode's round length (the settling time of spinning pools stays)."""
    monkeypatch.setattr(compare_module, "SPINNING_SETTLE_SECONDS", 0.004)
    result = compare(_model(), _model(), backend="ort-cpu", rounds=2, warmup=0, spinning=spinning,
                     round_seconds=0.006)
    assert result["rounds"] == 2
    log = fake_runners["log"]
    rounds = log[-2 * 2 * per_round:]
    blocks = [rounds[i:i + per_round] for i in range(0, len(rounds), per_round)]
    assert [b[0] for b in blocks] == [0, 1, 1, 0] and all(len(set(b)) == 1 for b in blocks)


@pytest.mark.parametrize("backend, threads, expected", [
    ("ort-cpu", None, dict(spinning=True, round_seconds=0.1)),
    ("ort-cpu", 1, dict(spinning=True, round_seconds=0.1)),  # no pool: the mode's settling runs still count
    ("ort-cuda", None, {}),
])
def test_the_whole_model_check_times_as_a_default_session_runs(monkeypatch, backend, threads, expected):
    """`epifuse optimize`'s whole-model check compares on ort-cpu with the pool spinning, as ONNX Runtime's
    default sessions run, in rounds of 0.1 s each after untimed runs; on ort-cuda as `epifuse compare`."""
    from optimizer import pipeline

    calls = []
    monkeypatch.setattr(compare_module, "compare", lambda *args, **kwargs: calls.append(kwargs) or {})
    check = pipeline.FusionPolicy().model_checker()
    check("a.onnx", "b.onnx", backend=backend, batch=1, precision="fp32", rounds=15, threads=threads)
    assert calls == [dict(backend=backend, batch=1, precision="fp32", rounds=15, threads=threads, **expected)]


def test_spinning_pools_are_onnx_runtimes_default():
    model = zoo.build("resnet_tiny", batch=1)
    sleeping = compare_module._CpuRunner(model, {}).session.get_session_options()
    assert sleeping.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    spinning = compare_module._CpuRunner(model, {}, spinning=True).session.get_session_options()
    with pytest.raises(Exception, match="does not have configuration"):  # not set: ORT's default, spinning
        spinning.get_session_config_entry("session.intra_op.allow_spinning")
    with pytest.raises(EpifuseError, match="ort-cpu"):
        compare(model, model, backend="ort-cuda", spinning=True)


def test_cli_spinning_needs_the_cpu(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["compare", str(src), str(src), "--backend", "ort-cuda", "--spinning"]) == 2
    assert "--spinning" in capsys.readouterr().err


def test_cli_threads_need_the_cpu(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--target", "ort-cuda", "--threads", "2"]) == 2
    assert main(["compare", str(src), str(src), "--backend", "ort-cpu", "--threads", "0"]) == 2
    assert not (tmp_path / "o.onnx").exists()
    assert "--threads" in capsys.readouterr().err


def test_cli_compare_without_a_gpu_says_which_backend_it_uses(tmp_path, capsys, monkeypatch):
    from optimizer import measure

    monkeypatch.setattr(measure, "cuda_device_name", lambda: None)
    src = tmp_path / "m.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["compare", str(src), str(src), "--runs", "2"]) == 0
    assert "using --backend ort-cpu" in capsys.readouterr().out


def test_require_faster_exits_3_and_writes_nothing_when_slower(tmp_path, capsys, fake_runners):
    fake_runners["times"] = (1e-3, 2e-3)
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["optimize", str(src), "-o", str(out), "--bench", "--runs", "4", "--require-faster"]) == 3
    assert not out.exists()
    text = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "slower" in text and "not written" in text
    fake_runners["times"] = (2e-3, 1e-3)
    assert main(["optimize", str(src), "-o", str(out), "--bench", "--runs", "4", "--require-faster"]) == 0
    assert out.exists() and "2.00x" in capsys.readouterr().out


def test_bench_does_not_time_the_original_kept_against_itself(tmp_path, capsys, monkeypatch):
    """Where the whole-model check wrote the input back, timing the two measures noise: identical models
    read 0.97x with three rounds in four "slower" on a 0.14 ms model, and --require-faster would then have
    refused the original itself."""
    from optimizer import cli, pipeline

    real = pipeline.optimize_file

    def keeps_the_original(src, out, **kwargs):
        report = real(src, out, **kwargs)
        report.original_kept = True
        return report

    monkeypatch.setattr(cli, "optimize_file", keeps_the_original)
    monkeypatch.setattr(cli, "_compare_files", lambda *a, **k: pytest.fail("timed the original against itself"))
    src, out, report = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["optimize", str(src), "-o", str(out), "--bench", "--require-faster", "--report", str(report)]) == 0
    assert "the original kept as it is, nothing to time" in capsys.readouterr().out
    assert out.exists() and json.loads(report.read_text())["bench"] == {"same_model": True, "slower": False}


def test_require_faster_needs_bench(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--require-faster"]) == 2
    assert "--require-faster needs --bench" in capsys.readouterr().err


def test_demo_prints_the_cpu_speedup_next_to_the_verify_line(tmp_path, capsys):
    assert main(["demo", "--output-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "verify on CPUExecutionProvider: PASS" in text
    assert "speed: ort-cpu, batch 1, fp32" in text and "speed-up" in text


@pytest.mark.parametrize("target, precision, is_original", [("ort-cpu", "fp32", True), ("ort-cpu", "bf16", True),
                                                          ("ort-cpu", "fp16", False), ("ort-cuda", "bf16", False)])
def test_the_baseline_is_what_the_runtime_would_run(target, precision, is_original):
    """The original where ORT would run it as it is (fp32; bf16 on the CPU EP, where nothing but the
    FusedConvs is bf16, as the whole-model check has it), else the original converted to the precision
    with nothing fused (its BatchNorms folded)."""
    from optimizer.passes.load import validate

    original = validate(zoo.build("resnet_tiny"))  # typed, as a loaded model is
    reference = compare_module.baseline(original, target, precision)
    assert (reference is original) == is_original
    if not is_original:
        assert "BatchNormalization" not in {n.op_type for n in reference.graph.node}
