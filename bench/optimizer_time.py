"""How long, and how much memory, epifuse's optimizer takes on a full-size model, next to onnxslim
and onnxsim.

    python bench/optimizer_time.py [--runs 3] [--models resnet50,resnet18] [--markdown FILE.md]

Builds a torchvision-shaped ResNet-50 (≈25.6 M parameters, ≈102 MB; models/resnet50.py) and a
ResNet-18 (≈47 MB) with random weights into a temporary folder, then runs each tool on each model
`--runs` times, every run in its own subprocess, and reports the median wall time and the median
peak RSS of that subprocess (GNU time's "Maximum resident set size", or a bare `python -S`
runner that reports wait4's rusage where there is no /usr/bin/time, so neither this script's
memory nor another tool's leaks into a figure).

epifuse runs as its CLI (`python -m optimizer optimize IN -o OUT --target ort-cpu --precision
fp32 --fuse auto --report R.json`, the same entry point as the `epifuse` console script, from this
checkout), with an empty costs cache each run, so every fusion candidate is measured on this machine;
the report's `pass_seconds` gives the time of the in-process passes alone, measuring ("measure") apart. onnxslim and onnxsim
run as their own console scripts with default options (`pip install -e .[bench]`, or pass
`--install-missing`).

The fuse pass asks the native kernel registry (libepifuse_core) whether each conv has a kernel.
`--kernel-query auto` (the default) uses it when it works on a small zoo model, and otherwise
answers "yes" for every conv (true on ort-cpu) so the timing still covers every pass; the output
says which one ran.

Targets: epifuse's wall time less its measuring within 2x of onnxslim's wall time, its measuring within
the measuring budget (`--measure-budget`, default 30 s), and epifuse's peak RSS at most 3x the model's
file size. Each is printed as a PASS/FAIL line per model.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

import onnx
from rich.console import Console
from rich.table import Table

TIME_FACTOR = 2.0     # epifuse wall time <= 2x onnxslim's
MEMORY_FACTOR = 3.0   # epifuse peak RSS <= 3x the model's size
MB = 1e6
# the report's JSON sorts its keys; show the passes in the order the pipeline runs them
PASS_ORDER = ["load", "import", "canonicalize", "fold_batchnorm", "fuse_conv", "measure", "layout", "precision",
              "cleanup", "save"]
MEASURE_BUDGET = 30.0  # seconds: epifuse optimize's default --measure-budget

# The epifuse child: its CLI, with the kernel registry replaced by "every conv has a kernel" when
# asked to (argv[1] == "stub"); the pipeline imports `kernel_count` from optimizer.registry at
# call time, so patching the module attribute is enough.
EPIFUSE_CHILD = """
import sys
if sys.argv.pop(1) == "stub":
    import optimizer.registry
    optimizer.registry.kernel_count = lambda target, desc: (1, "")
from optimizer.cli import main
sys.exit(main(sys.argv[1:]))
"""


# ------------------------------------------------------------------------------------- models
def build_models(names: list[str], folder: Path, console: Console) -> dict[str, Path]:
    from models.resnet50 import resnet18, resnet50  # noqa: PLC0415

    builders = {"resnet50": resnet50, "resnet18": resnet18}
    paths = {}
    for name in names:
        start = time.perf_counter()
        model = builders[name]()
        path = folder / f"{name}.onnx"
        onnx.save(model, path)
        console.print(f"built {name}: {len(model.graph.node)} nodes, "
                      f"{path.stat().st_size / MB:.1f} MB, in {time.perf_counter() - start:.1f} s "
                      f"→ {path}")
        paths[name] = path
    return paths


def graph_summary(path: Path) -> dict:
    model = onnx.load(str(path), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    return {"nodes": len(ops), "bn": ops.count("BatchNormalization"),
            "fused": sum(1 for n in model.graph.node
                         if n.op_type == "FusedConv" and n.domain.startswith("epifuse")),
            "conv": ops.count("Conv")}


# -------------------------------------------------------------------------------------- tools
def console_script(name: str) -> str | None:
    """The tool's console script next to this interpreter (not a pyenv shim, which adds a bash
    and a pyenv process to every run), else whatever PATH has."""
    candidate = Path(sysconfig.get_path("scripts")) / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def tool_command(tool: str, src: Path, dst: Path, report: Path, kernel_query: str) -> list[str]:
    if tool == "epifuse":
        return [sys.executable, "-c", EPIFUSE_CHILD, kernel_query, "optimize", str(src), "-o", str(dst),
                "--target", "ort-cpu", "--precision", "fp32", "--fuse", "auto", "--report", str(report)]
    script = console_script(tool)
    if script is None:
        raise FileNotFoundError(tool)
    return [script, str(src), str(dst)]


@dataclass
class Run:
    wall: float
    maxrss_kb: int
    rc: int
    stderr: str = ""


# Fallback when there is no GNU time: a bare interpreter (python -S, ≈10 MB) that forks and execs
# the tool and writes the rusage wait4 gives for it. Measuring from this script's own process
# would be wrong: Linux carries the parent's peak RSS across fork + exec into the child's
# ru_maxrss, and this process holds the models it built.
RUNNER = """
import os, sys
out, cmd = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    try:
        os.execvp(cmd[0], cmd)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(out, "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""
GNU_TIME = "/usr/bin/time"


def rss_wrapper(rss_file: Path) -> list[str]:
    if os.access(GNU_TIME, os.X_OK):
        return [GNU_TIME, "-f", "%M", "-o", str(rss_file)]
    return [sys.executable, "-S", "-c", RUNNER, str(rss_file)]


def run_measured(cmd: list[str], log: Path) -> Run:
    """Run `cmd` as one child; wall time from here, peak RSS of exactly that child from GNU time
    (`-f %M`, what `time -v` calls "Maximum resident set size") or from the RUNNER above."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               TERM="dumb", COLUMNS="120", EPIFUSE_COSTS_CACHE=str(log.with_suffix(".costs.json")))  # empty
    rss_file = log.with_suffix(".rss")
    with open(log, "w") as out:
        start = time.perf_counter()
        rc = subprocess.call([*rss_wrapper(rss_file), *cmd], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env)
        wall = time.perf_counter() - start
    try:
        # GNU time writes "Command exited with non-zero status N" before the figure on failure
        maxrss_kb = int(rss_file.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        maxrss_kb = 0
    tail = "" if rc == 0 else log.read_text()[-2000:]
    return Run(wall, maxrss_kb, rc, tail)


def probe_registry(folder: Path) -> tuple[bool, str]:
    """Does the real kernel registry work? Optimize the small zoo ResNet with it."""
    from models.zoo import resnet_tiny  # noqa: PLC0415

    src = folder / "probe.onnx"
    onnx.save(resnet_tiny(batch=1), src)
    run = run_measured(tool_command("epifuse", src, folder / "probe.epifuse.onnx", folder / "probe.json", "real"),
                       folder / "probe.log")
    if run.rc == 0:
        return True, ""
    last = [line for line in run.stderr.strip().splitlines() if line.strip()]
    return False, last[-1] if last else f"exit status {run.rc}"


# ---------------------------------------------------------------------------------- measuring
@dataclass
class Row:
    tool: str
    model: str
    model_mb: float
    runs: list[Run] = field(default_factory=list)
    before: dict | None = None
    after: dict | None = None
    pass_seconds: list[dict[str, float]] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(r.rc == 0 for r in self.runs)

    @property
    def wall(self) -> float:
        return statistics.median(r.wall for r in self.runs)

    @property
    def rss_mb(self) -> float:
        return statistics.median(r.maxrss_kb for r in self.runs) * 1024 / MB

    def passes(self) -> dict[str, float]:
        """The report's pass_seconds of the run with the median wall time (one consistent run,
        so the passes add up against that run's wall time), in pipeline order."""
        if not self.pass_seconds or len(self.pass_seconds) != len(self.runs):
            return {}
        by_wall = sorted(range(len(self.runs)), key=lambda i: self.runs[i].wall)
        seconds = self.pass_seconds[by_wall[(len(by_wall) - 1) // 2]]
        return {k: seconds[k] for k in sorted(seconds, key=lambda k: (PASS_ORDER.index(k)
                                                                    if k in PASS_ORDER else len(PASS_ORDER)))}

    @property
    def measure_seconds(self) -> float:
        """Median over runs of the time spent measuring fusion candidates (epifuse's report)."""
        return statistics.median(p.get("measure", 0.0) for p in self.pass_seconds) if self.pass_seconds else 0.0

    @property
    def median_run_wall(self) -> float:
        walls = sorted(r.wall for r in self.runs)
        return walls[(len(walls) - 1) // 2]

    def did(self) -> str:
        if not self.ok:
            return self.error or "failed"
        if self.before is None or self.after is None:
            return ""
        b, a = self.before, self.after
        text = f"nodes {b['nodes']}→{a['nodes']}, BN left {a['bn']}"
        if self.tool == "epifuse":
            text += f", fused convs {a['fused']}/{b['conv']}"
        else:
            text += f", fused convs 0 (Conv {a['conv']})"
        return text


def measure(tool: str, model: str, src: Path, folder: Path, runs: int, kernel_query: str,
            console: Console) -> Row:
    row = Row(tool, model, src.stat().st_size / MB, before=graph_summary(src))
    dst = folder / f"{model}.{tool}.onnx"
    for i in range(runs):
        report = folder / f"{model}.{tool}.{i}.json"
        try:
            cmd = tool_command(tool, src, dst, report, kernel_query)
        except FileNotFoundError:
            row.error = f"{tool} not installed (pip install -e .[bench])"
            return row
        if dst.exists():
            dst.unlink()
        run = run_measured(cmd, folder / f"{model}.{tool}.{i}.log")
        row.runs.append(run)
        console.print(f"  {tool:8s} {model}: run {i + 1}/{runs} {run.wall:6.2f} s, "
                      f"{run.maxrss_kb * 1024 / MB:6.0f} MB peak RSS" + ("" if run.rc == 0 else f", exit {run.rc}"))
        if run.rc != 0:
            last = [line for line in run.stderr.strip().splitlines() if line.strip()]
            row.error = f"exit {run.rc}: {last[-1] if last else ''}"[:200]
            return row
        if report.exists():
            row.pass_seconds.append(json.loads(report.read_text())["pass_seconds"])
    row.after = graph_summary(dst)
    return row


def baseline_rss() -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of a Python that only imports epifuse's dependencies."""
    with tempfile.TemporaryDirectory() as tmp:
        run = run_measured([sys.executable, "-c", "import numpy, onnx, onnx_graphsurgeon, onnxruntime, rich, "
                            "optimizer.cli, optimizer.pipeline"], Path(tmp) / "log")
    return run.wall, run.maxrss_kb * 1024 / MB


# ------------------------------------------------------------------------------------ output
COLUMNS = ["tool", "model", "model MB", "wall s median (min–max)", "peak RSS MB", "RSS / model", "what it did"]


def table_rows(rows: list[Row]) -> list[list[str]]:
    out = []
    for r in rows:
        if r.ok:
            spread = f" ({min(x.wall for x in r.runs):.2f}–{max(x.wall for x in r.runs):.2f})" if len(r.runs) > 1 else ""
            out.append([r.tool, r.model, f"{r.model_mb:.1f}", f"{r.wall:.2f}{spread}", f"{r.rss_mb:.0f}",
                        f"{r.rss_mb / r.model_mb:.1f}x", r.did()])
        else:
            out.append([r.tool, r.model, f"{r.model_mb:.1f}", "—", "—", "—", r.did()])
    return out


def verdicts(rows: list[Row]) -> list[tuple[bool | None, str]]:
    lines = []
    by = {(r.tool, r.model): r for r in rows}
    for model in dict.fromkeys(r.model for r in rows):
        epi, slim = by.get(("epifuse", model)), by.get(("onnxslim", model))
        if epi is None or not epi.ok:
            lines.append((None, f"{model}: epifuse did not run, no verdict"))
            continue
        if slim is not None and slim.ok:
            ratio = (epi.wall - epi.measure_seconds) / slim.wall
            lines.append((ratio <= TIME_FACTOR,
                          f"{model}: time   epifuse {epi.wall:.2f} s less {epi.measure_seconds:.2f} s measuring vs "
                          f"onnxslim {slim.wall:.2f} s = {ratio:.2f}x (target ≤ {TIME_FACTOR:.0f}x)"))
            lines.append((epi.measure_seconds <= MEASURE_BUDGET,
                          f"{model}: measuring {epi.measure_seconds:.2f} s (budget {MEASURE_BUDGET:.0f} s)"))
        else:
            lines.append((None, f"{model}: time   onnxslim did not run, no verdict"))
        ratio = epi.rss_mb / epi.model_mb
        lines.append((ratio <= MEMORY_FACTOR,
                      f"{model}: memory epifuse peak RSS {epi.rss_mb:.0f} MB vs model {epi.model_mb:.1f} MB = "
                      f"{ratio:.1f}x (target ≤ {MEMORY_FACTOR:.0f}x)"))
    return lines


def _word(ok: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "N/A"}[ok]


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
                break
    except (OSError, subprocess.CalledProcessError):
        pass
    return f"{os.cpu_count()} cores, {model}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def to_markdown(rows: list[Row], lines: list[tuple[bool | None, str]], meta: dict[str, str]) -> str:
    md = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(["---"] * len(COLUMNS)) + "|"]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in table_rows(rows)]
    md.append("")
    md += [f"- **{_word(ok)}** {text}" for ok, text in lines]
    md.append("")
    for r in rows:
        passes = r.passes()
        if passes:
            total = sum(passes.values())
            md.append(f"epifuse passes on {r.model} (seconds, in process, from the `--report` of the median run: "
                      f"{total:.2f} s of its {r.median_run_wall:.2f} s wall):")
            md.append("")
            md.append("| " + " | ".join(passes) + " | total |")
            md.append("|" + "|".join(["---:"] * (len(passes) + 1)) + "|")
            md.append("| " + " | ".join(f"{v:.3f}" for v in passes.values()) + f" | {total:.3f} |")
            md.append("")
    md += [f"- {k}: {v}" for k, v in meta.items()]
    return "\n".join(md) + "\n"


# -------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per tool and model (median reported)")
    parser.add_argument("--models", default="resnet50,resnet18", help="comma-separated: resnet50, resnet18")
    parser.add_argument("--tools", default="epifuse,onnxslim,onnxsim", help="comma-separated")
    parser.add_argument("--kernel-query", choices=("auto", "real", "stub"), default="auto",
                        help="epifuse's kernel registry: the native one, 'every conv has a kernel', or "
                             "the native one when it works (default)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table as markdown")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep the models there")
    parser.add_argument("--install-missing", action="store_true",
                        help="pip install onnxslim / onnxsim when they are missing")
    args = parser.parse_args(argv)
    console = Console(width=max(Console().width, 170))
    models = [m for m in args.models.split(",") if m]
    tools = [t for t in args.tools.split(",") if t]

    if args.install_missing:
        missing = [t for t in tools if t != "epifuse" and console_script(t) is None]
        if missing:
            console.print(f"installing {', '.join(missing)}")
            specs = [{"onnxslim": "onnxslim>=0.1.90", "onnxsim": "onnxsim>=0.4"}.get(t, t) for t in missing]
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", *specs], check=True)

    with tempfile.TemporaryDirectory(prefix="epifuse-bench-") as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        paths = build_models(models, folder, console)

        kernel_query, registry_note = args.kernel_query, "native kernel registry (libepifuse_core)"
        if "epifuse" in tools and kernel_query == "auto":
            works, why = probe_registry(folder)
            kernel_query = "real" if works else "stub"
            if not works:
                registry_note = f"stub 'every conv has a kernel' (native registry failed: {why})"
                console.print(f"[yellow]note[/yellow]: {registry_note}")
        elif kernel_query == "stub":
            registry_note = "stub 'every conv has a kernel' (--kernel-query stub)"

        base_wall, base_rss = baseline_rss()
        rows = []
        for model, src in paths.items():
            for tool in tools:
                rows.append(measure(tool, model, src, folder, args.runs, kernel_query, console))

    table = Table(title=f"optimizer time and memory (median of {args.runs} runs, one subprocess each)")
    for c in COLUMNS:
        table.add_column(c, justify="right" if c not in ("tool", "model", "what it did") else "left")
    for cells in table_rows(rows):
        table.add_row(*cells)
    console.print(table)

    for r in rows:
        passes = r.passes()
        if passes:
            total = sum(passes.values())
            inner = sum(v for k, v in passes.items() if k not in ("load", "save"))
            console.print(f"epifuse passes on {r.model} (s, median run): "
                          + ", ".join(f"{k} {v:.3f}" for k, v in passes.items())
                          + f"; in process {total:.2f} s (passes without load/save {inner:.2f} s), "
                            f"interpreter start + imports + CLI ≈ {r.median_run_wall - total:.2f} s")
    console.print(f"floor: a Python that only imports epifuse's dependencies takes {base_wall:.2f} s and "
                  f"{base_rss:.0f} MB peak RSS")
    console.print(f"epifuse kernel query: {registry_note}")

    lines = verdicts(rows)
    for ok, text in lines:
        colour = {True: "green", False: "red", None: "yellow"}[ok]
        console.print(f"[{colour}]{_word(ok)}[/{colour}] {text}")

    if args.markdown:
        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%a %b %d %H:%M:%S UTC %Y"),
            "machine": machine(),
            "versions": ", ".join(f"{d} {version(d)}" for d in
                                  ("onnx", "onnxruntime", "onnx-graphsurgeon", "onnxslim", "onnxsim", "numpy")),
            "epifuse kernel query": registry_note,
            "floor (Python importing epifuse's dependencies only)": f"{base_wall:.2f} s, {base_rss:.0f} MB peak RSS",
            "method": f"median of {args.runs} runs per tool and model, each run its own subprocess; wall time "
                      "from the parent, peak RSS from " + ("GNU time (%M)" if os.access(GNU_TIME, os.X_OK)
                                                           else "wait4's rusage in a bare runner"),
        }
        Path(args.markdown).write_text(to_markdown(rows, lines, meta))
        console.print(f"wrote {args.markdown}")
    return 0 if all(ok is not False for ok, _ in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
