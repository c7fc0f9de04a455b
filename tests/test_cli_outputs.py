"""What `epifuse optimize` leaves on disk when a check after the write fails, and which paths its
report may not take."""
import onnx

from models import zoo
from optimizer.cli import main


def _source(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(zoo.build("resnet_tiny", batch=1), src)
    return src


def test_a_failed_verification_removes_the_output(tmp_path, monkeypatch, capsys):
    import optimizer.verify

    src, out = _source(tmp_path), tmp_path / "o.onnx"
    monkeypatch.setattr(optimizer.verify, "verify", lambda *a, **k: {
        "provider": "CPUExecutionProvider", "passed": False, "worst_rel_l2": 1.0, "tolerance": 1e-5, "outputs": 1,
        "rel_l2": {"y": 1.0}})
    assert main(["optimize", str(src), "-o", str(out), "--verify"]) == 1
    assert not out.exists() and "not written" in capsys.readouterr().out


def test_the_report_may_not_overwrite_a_model(tmp_path, capsys):
    src, out = _source(tmp_path), tmp_path / "o.onnx"
    before = src.read_bytes()
    assert main(["optimize", str(src), "-o", str(out), "--report", str(src)]) == 2
    assert src.read_bytes() == before
    assert "--report would overwrite a model" in capsys.readouterr().err
    assert not out.exists()
