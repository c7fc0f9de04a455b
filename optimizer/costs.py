"""Where the fusion decision's times come from.

A fusion group is one candidate of the fuse pass: a conv with the activation and residual Add it
would absorb. Two times decide it: the FusedConv on the target (`ours_us`) and what the runtime runs
for the same original nodes (`runtime_us`). They come, in order of preference, from

- a measurement on the machine that optimizes (`MeasuredCosts`: ONNX Runtime on the CPU, or on the
  GPU when one is present and the library has its CUDA kernels), kept in a cache beside the tuning
  cache so a second run measures nothing;
- a costs file measured earlier on the target (`FileCosts`, written by `epifuse tune --export-costs`),
  for optimizing on a machine without the target's GPU;
- nothing: the decision then falls back to the static policy in `optimizer.decide`.

Entries are keyed by device, library versions, dtype and problem (`FusionGroup.key`). A costs file is
matched on device and problem only: the machine that reads it need not have the target's runtime.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_graphsurgeon as gs

from .contract import PRECISION_OF_CODE
from .errors import EpifuseError
from .passes.save import umask
from .registry import ConvDesc

COSTS_FORMAT = "epifuse-costs/1"
TIMES = ("ours_us", "runtime_us", "reorder_in_us", "reorder_out_us")  # an entry's numbers; the last two optional


# The patterns of a small global average pool inside an NHWC region, which pool_as_conv would give to
# FusedConv. Their runtime side is the pool as the pipeline leaves it unfused there, not ONNX Runtime's
# NCHW GlobalAveragePool: ReduceMean over the NHWC tensor's H and W (the layout pass), which
# passes.nhwc_pools turns into a GEMV where the target runs that faster (the _GEMV pattern).
NHWC_POOL, NHWC_POOL_GEMV = "GlobalAveragePool(NHWC)", "GlobalAveragePool(NHWC GEMV)"


@dataclass
class FusionGroup:
    """One candidate at one batch size, with concrete shapes: the original nodes (NCHW) and the
    FusedConv problem that would replace them."""

    name: str                         # the conv node, as the report names it
    pattern: str                      # the original ops, e.g. "Conv+Sigmoid+Mul+Add"
    desc: ConvDesc                    # the FusedConv problem, in the dtype it will run in
    nodes: list[gs.Node]              # the original nodes, producer first
    x: gs.Tensor                      # their data input, the residual (or None) and the output
    z: gs.Tensor | None
    y: gs.Tensor
    x_shape: tuple[int, ...]          # concrete shapes (NCHW, or [N, C] for a Gemm)
    z_shape: tuple[int, ...] | None
    y_shape: tuple[int, ...]
    weight: np.ndarray                # the conv's filter, OIHW, and bias, as the graph holds them
    bias: np.ndarray

    @property
    def dtype(self) -> str:
        return PRECISION_OF_CODE[self.desc.dtype]

    @property
    def key(self) -> str:
        d = self.desc
        act = d.activation + (f"({','.join(f'{p:g}' for p in d.activation_params)})" if d.activation_params else "")
        dtype = self.dtype + ("(tf32)" if d.allow_tf32 else "")
        return (f"{self.pattern}|{dtype}|x{'x'.join(map(str, self.x_shape))}|k{d.K} {d.R}x{d.S} g{d.group} "
                f"s{d.stride_h},{d.stride_w} d{d.dil_h},{d.dil_w} p{d.pad_top},{d.pad_left},{d.pad_bottom},"
                f"{d.pad_right}|{act}|{d.residual}")


def transpose_key(shape, dtype: str) -> str:
    return f"Transpose|{dtype}|x{'x'.join(map(str, shape))}"


@dataclass(frozen=True)
class Timing:
    """Microseconds per call of the FusedConv and of the runtime's own nodes, and where they come from.
    `reorder_in_us`, `reorder_out_us`: ONNX Runtime's CPU EP moving the group's input into its NCHWc
    layout and its output out of it, not in `runtime_us`: the runtime's cost only where the model
    reorders there too (optimizer.measure)."""

    ours_us: float
    runtime_us: float
    source: str
    batch: int = 0
    reorder_in_us: float = 0.0
    reorder_out_us: float = 0.0


@dataclass
class CostTable:
    """Measurements by (device, library, key): the measuring cache and the costs file's content."""

    entries: dict[tuple[str, str, str], dict] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | os.PathLike, *, missing_ok: bool = False) -> "CostTable":
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            if missing_ok:
                return cls()
            raise EpifuseError("no such costs file", path=str(path)) from None
        except (OSError, ValueError) as e:
            raise EpifuseError(f"cannot read costs file: {e}", path=str(path)) from None
        if not isinstance(data, dict) or data.get("format") != COSTS_FORMAT:
            raise EpifuseError(f"not an epifuse costs file (expected format {COSTS_FORMAT!r})", path=str(path))
        table = cls()
        for i, e in enumerate(data.get("measurements", [])):
            try:
                table.entries[(e["device"], e["library"], e["key"])] = {k: float(e[k]) for k in TIMES if k in e}
            except (KeyError, TypeError, ValueError):
                raise EpifuseError(f"measurement {i} lacks device, library, key or a number", path=str(path)) from None
        return table

    def save(self, path: str | os.PathLike) -> None:
        """Atomically, so a reader (or a second epifuse process) never sees half a file."""
        path = Path(path)
        if path.is_dir():
            raise EpifuseError("is a folder, not a costs file", path=str(path))
        if not path.parent.is_dir():
            raise EpifuseError("folder does not exist", path=str(path))
        rows = [{"device": d, "library": lib, "key": k, **v} for (d, lib, k), v in sorted(self.entries.items())]
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"format": COSTS_FORMAT, "measurements": rows}, f, indent=1)
            os.chmod(tmp, 0o666 & ~umask())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def devices(self) -> set[str]:
        return {d for d, _, _ in self.entries}


class Costs:
    """No times at all: every decision is the static policy's."""

    description = "no measurement"

    def group_timing(self, group: FusionGroup) -> Timing | None:
        return None

    def transpose_us(self, shape, dtype: str) -> float | None:
        return None

    def why_unknown(self, group: FusionGroup | None = None) -> str:
        return "nothing measured"


class FileCosts(Costs):
    """A costs file measured on the target (`epifuse tune --export-costs`). Only keys it holds have times."""

    def __init__(self, path: str, device: str | None = None):
        self.path = path
        self.table = CostTable.load(path)
        devices = self.table.devices()
        if device is None:
            if len(devices) > 1:
                raise EpifuseError(f"holds measurements of several devices ({', '.join(sorted(devices))}); "
                                   "name one with --costs-device", path=path)
            device = next(iter(devices), "")
        elif device not in devices:
            raise EpifuseError(f"has no measurements of device {device!r} (it has: {', '.join(sorted(devices))})",
                               path=path)
        self.device = device
        self.by_key = {k: v for (d, _, k), v in self.table.entries.items() if d == device}
        self.description = f"costs file {path} ({device})"

    def group_timing(self, group: FusionGroup) -> Timing | None:
        v = self.by_key.get(group.key)
        if v is None or "ours_us" not in v or "runtime_us" not in v:
            return None
        return Timing(v["ours_us"], v["runtime_us"], f"costs file ({self.device})", group.desc.N,
                      v.get("reorder_in_us", 0.0), v.get("reorder_out_us", 0.0))

    def transpose_us(self, shape, dtype: str) -> float | None:
        v = self.by_key.get(transpose_key(shape, dtype))
        return v.get("runtime_us") if v else None

    def why_unknown(self, group: FusionGroup | None = None) -> str:
        return f"not in {self.path}"


class MeasuredCosts(Costs):
    """Times measured on this machine by `timer` (optimizer.measure.OrtTimer or a test's fake), within
    `budget_s` seconds of `clock`, read from and added to the cache table `cache`."""

    def __init__(self, timer, *, budget_s: float, cache: CostTable | None = None, cache_path: str | None = None,
                 clock=time.perf_counter):
        self.timer, self.budget_s, self.clock = timer, budget_s, clock
        self.cache = cache if cache is not None else CostTable()
        self.cache_path = cache_path
        self.started: float | None = None
        self.spent = False
        self.seconds = 0.0                    # spent measuring (the cache's hits cost nothing)
        self.measured: dict[str, dict] = {}   # this run's keys and values, cached or new (for --export-costs)
        self.failures: dict[str, str] = {}    # keys that could not be measured, and why
        self.progress = None                  # called with a line before each measurement (the CLI's status)
        self.description = f"measured on {timer.device} ({timer.library})"

    def _lookup(self, key: str) -> dict | None:
        return self.cache.entries.get((self.timer.device, self.timer.library, key))

    def _in_budget(self) -> bool:
        if self.budget_s <= 0:  # a budget of 0: the cache's times only
            self.spent = True
        if self.started is None:
            self.started = self.clock()
        if self.clock() - self.started > self.budget_s:
            self.spent = True
        return not self.spent

    def group_timing(self, group: FusionGroup) -> Timing | None:
        v = self._lookup(group.key)
        if v is not None and getattr(self.timer, "times_reorders", False) and "reorder_in_us" not in v:
            v = None  # cached before reorders were timed: measured again
        if v is None:
            if not self._in_budget():
                return None
            start = self.clock()
            if self.progress is not None:
                self.progress(f"measuring {group.name} at batch {group.desc.N} "
                              f"({self.clock() - self.started:.0f} s of {self.budget_s:g} s)")
            try:
                # (ours, runtime) or, from a timer that times reorders, (ours, runtime, (in, out))
                ours, runtime, *reorders = self.timer.group_times(group)
                # a win is measured again, unless the timer already read it several times: two wins keep
                # the worse of the two (on a small layer noise alone can make one reading a win); where
                # the second reading is a loss, a third decides, each side's median of the three (on a
                # shared 2-core host one slow spell read a ConvNeXt-T 1x1 at 2.3 ms against 1.1 in
                # the readings before and after, and left three 1 ms wins unfused)
                if ours < runtime and not getattr(self.timer, "confirms_wins", False):
                    again = self.timer.group_times(group)
                    if again[0] < again[1]:
                        ours, runtime = max(ours, again[0]), min(runtime, again[1])
                    else:
                        third = self.timer.group_times(group)
                        ours = statistics.median((ours, again[0], third[0]))
                        runtime = statistics.median((runtime, again[1], third[1]))
            except Exception as e:  # noqa: BLE001 (a micro-model ORT refuses is left to the static policy)
                self.failures[group.key] = str(e)
                return None
            finally:
                self.seconds += self.clock() - start
            v = {"ours_us": ours, "runtime_us": runtime}
            if reorders:
                v["reorder_in_us"], v["reorder_out_us"] = reorders[0]
            self.cache.entries[(self.timer.device, self.timer.library, group.key)] = v
        self.measured[group.key] = v
        return Timing(v["ours_us"], v["runtime_us"], f"measured ({self.timer.device})", group.desc.N,
                      v.get("reorder_in_us", 0.0), v.get("reorder_out_us", 0.0))

    def transpose_us(self, shape, dtype: str) -> float | None:
        key = transpose_key(shape, dtype)
        v = self._lookup(key)
        if v is None:
            if not self._in_budget():
                return None
            start = self.clock()
            try:
                v = {"runtime_us": self.timer.transpose_times(tuple(shape), dtype)}
            except Exception:  # noqa: BLE001 (an unmeasured Transpose counts as free: the region step is a refinement)
                return None
            finally:
                self.seconds += self.clock() - start
            self.cache.entries[(self.timer.device, self.timer.library, key)] = v
        self.measured[key] = v
        return v["runtime_us"]

    def why_unknown(self, group: FusionGroup | None = None) -> str:
        if group is not None and group.key in self.failures:
            return f"not measurable: {self.failures[group.key]}"
        return f"measuring budget of {self.budget_s:g} s spent" if self.spent else "shapes not fully known"

    def close(self) -> None:
        """Ends the timer's worker, if it has one."""
        close = getattr(self.timer, "close", None)
        if close is not None:
            close()

    def save_cache(self) -> None:
        if self.cache_path:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(self.cache_path)), exist_ok=True)
                self.cache.save(self.cache_path)
            except (OSError, EpifuseError):
                pass  # a cache that cannot be written costs the next run its measuring time, nothing else

    def export(self, path: str) -> int:
        """Writes this run's measurements (cached or new) as a costs file; returns their count."""
        table = CostTable({(self.timer.device, self.timer.library, k): v for k, v in self.measured.items()})
        table.save(path)
        return len(table.entries)


def default_cache_path() -> str:
    return os.environ.get("EPIFUSE_COSTS_CACHE", os.path.expanduser("~/.cache/epifuse/costs.json"))
