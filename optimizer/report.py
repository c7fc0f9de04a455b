"""What a run of the optimizer did, for the summary table and --report FILE.json."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class Skipped:
    node: str
    op: str
    reason: str


@dataclass
class Decision:
    """One fusion candidate: its times (µs per call, one per batch size asked for) and the verdict."""

    node: str
    pattern: str
    fused: bool
    reason: str
    batches: list[int] = field(default_factory=list)
    ours_us: list[float] = field(default_factory=list)
    runtime_us: list[float] = field(default_factory=list)
    source: str = ""
    elements: int = 0   # the group's data in and out (elements, first batch size): the check's ordering


@dataclass
class Report:
    model: str = ""
    target: str = "ort-cpu"
    precision: str = "fp32"
    nodes_before: int = 0
    nodes_after: int = 0
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    bn_folded: Counter = field(default_factory=Counter)      # producer op -> count
    bn_to_affine: int = 0                                     # BN with no foldable producer -> Mul+Add
    affine_folded: Counter = field(default_factory=Counter)  # Mul/Add/Sub/Div folded into a conv, by op
    fusions: Counter = field(default_factory=Counter)         # "activation/residual" -> count
    skipped: list[Skipped] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    costs: str = ""                                           # where the decisions' times came from
    transposes_inserted: int = 0
    transposes_removed: int = 0
    activation_bytes_saved: int = 0                           # per image, written + read
    canonicalized: Counter = field(default_factory=Counter)
    pass_seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    verify: dict | None = None
    bench: dict | None = None                                 # optimize --bench: optimizer.compare's result
    original_kept: bool = False                               # the whole-model check kept the input as it was

    def skip(self, node, reason: str) -> None:
        self.skipped.append(Skipped(node.name, node.op, reason))

    def decide(self, node, pattern: str, verdict) -> None:
        timed = verdict.measured()
        self.decisions.append(Decision(
            node.name, pattern, verdict.fuse, verdict.reason,
            [t.batch for t in verdict.timings] if timed else [],
            [round(t.ours_us, 2) for t in verdict.timings] if timed else [],
            [round(t.runtime_us, 2) for t in verdict.timings] if timed else [],
            verdict.timings[0].source if timed else "static policy" if not verdict.reason.startswith("fused wherever")
            else "fuse=always", verdict.elements))

    def fused_count(self) -> int:
        return sum(self.fusions.values())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bn_folded"] = dict(self.bn_folded)
        d["affine_folded"] = dict(self.affine_folded)
        d["fusions"] = dict(self.fusions)
        d["canonicalized"] = dict(self.canonicalized)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def render(self, console) -> None:
        from rich.table import Table  # noqa: PLC0415 (rich is only needed for the CLI)

        console.print(f"[bold]epifuse[/bold] {self.model} — target {self.target}, {self.precision}", highlight=False)
        summary = Table(show_header=False)
        summary.add_column(style="bold")
        summary.add_column(justify="right")
        summary.add_row("nodes before → after", f"{self.nodes_before} → {self.nodes_after}")
        summary.add_row("BatchNorm folded", _counts(self.bn_folded) or "0")
        if self.bn_to_affine:
            summary.add_row("BatchNorm → Mul+Add (no foldable producer)", str(self.bn_to_affine))
        if self.affine_folded:
            summary.add_row("constant scale / shift folded into Conv", _counts(self.affine_folded))
        summary.add_row("FusedConv nodes", str(self.fused_count()))
        summary.add_row("transposes inserted / removed", f"{self.transposes_inserted} / {self.transposes_removed}")
        summary.add_row("Transpose nodes left", str(self.ops_after.get("Transpose", 0)))
        summary.add_row("activation bytes saved per image", _bytes(self.activation_bytes_saved))
        if self.canonicalized:
            summary.add_row("canonicalized", _counts(self.canonicalized))
        summary.add_row("time", f"{sum(self.pass_seconds.values()):.2f} s")
        console.print(summary)
        if self.fusions:
            fused = Table(title="fusions (activation / residual)")
            fused.add_column("activation")
            fused.add_column("residual")
            fused.add_column("count", justify="right")
            for key, n in sorted(self.fusions.items()):
                act, res = key.split("/")
                fused.add_row(act, res, str(n))
            console.print(fused)
        if self.decisions:
            console.print(self.decision_table())
        if self.skipped:
            skipped = Table(title="not fused")
            skipped.add_column("node")
            skipped.add_column("op")
            skipped.add_column("reason")
            for s in self.skipped:
                skipped.add_row(s.node, s.op, s.reason)
            console.print(skipped)
        if self.costs:
            console.print(f"[dim]decisions:[/dim] {self.costs}", highlight=False)
        for note in self.notes:
            console.print(f"[dim]note:[/dim] {note}")
        if self.verify:
            v = self.verify
            status = "[green]PASS[/green]" if v["passed"] else "[red]FAIL[/red]"
            own = max(v.get("precision_own_rel_l2", {}).values(), default=0.0)
            why = f"; the precision alone makes {own:.1e}" if 2 * own >= v["tolerance"] else ""
            console.print(f"verify on {v['provider']}: {status} — worst relative L2 error "
                          f"{v['worst_rel_l2']:.2e} (bound {v['tolerance']:.1e}{why}) over {v['outputs']} outputs")
            if v.get("diagnosis"):
                console.print(f"[dim]why:[/dim] {v['diagnosis']}", highlight=False)


    def decision_table(self):
        """Every candidate with both times (µs per call at each batch size) and the decision."""
        from rich.table import Table  # noqa: PLC0415

        table = Table(title="fusion decisions (µs per call: FusedConv / runtime's own nodes)")
        for col in ("node", "pattern", "batch", "FusedConv µs", "runtime µs", "fused", "why"):
            table.add_column(col, justify="right" if col.endswith("µs") or col == "batch" else "left")
        for d in self.decisions:
            table.add_row(d.node, d.pattern, ", ".join(map(str, d.batches)) or "–",
                          ", ".join(f"{v:.1f}" for v in d.ours_us) or "–",
                          ", ".join(f"{v:.1f}" for v in d.runtime_us) or "–",
                          "[green]yes[/green]" if d.fused else "no", d.reason)
        return table


def _counts(c: Counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items()))


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
