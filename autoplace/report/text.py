"""The terminal summary: ``rich`` tables for a person at a terminal, and the same tables as
plain text for ``summary.txt``.

``summary_renderable`` builds the tables from ``analysis.overview``; ``print_summary`` prints
them (in colour on a terminal), ``summary_text`` returns them as plain text.
"""

from __future__ import annotations

import io
from typing import Any

from autoplace.formats.plan import MESH_SOLVER, Plan, SolverRecord, unplaced
from autoplace.report.analysis import Overview, no_speedup_reason, overview
from autoplace.report.units import format_bytes, format_ratio, format_seconds, format_share
from autoplace.solve.options import DEFAULT_TIME_LIMIT_S
from autoplace.solve.pins import pin_list

__all__ = ["print_summary", "summary_renderable", "summary_text"]


def speedup_text(ov: Overview) -> str:
    if ov.speedup_over_single is None or ov.best_single_device is None:
        return f"n/a ({no_speedup_reason(ov.pins)})"
    return (f"{format_ratio(ov.speedup_over_single)} over the best single device "
            f"({ov.best_single_device}, {format_seconds(ov.best_single_s)})")


def gap_text(ov: Overview) -> str:
    return "gap unknown" if ov.gap is None else f"gap {ov.gap:.1%}"


def solver_text(ov: Overview) -> str:
    solver = ov.solver
    return f"{solver.name}: {solver.status_text} in {format_seconds(solver.wall_s)}" + (
        f" ({limit})" if (limit := limit_text(solver)) else "")


def limit_text(solver: SolverRecord) -> str:
    """The time limit as the plan was given it, and how it was shared: "limit 10 s, the
    default: 0.83 s to the what-if rows, 9.17 s to this solve"; where the plan did not record
    what it was given, the solve's own limit."""
    if solver.budget_s is None:
        return f"limit {format_seconds(solver.time_limit_s)}" if solver.time_limit_s else ""
    given = f"limit {solver.budget_s:g} s" + (
        ", the default" if solver.budget_s == DEFAULT_TIME_LIMIT_S else "")
    if solver.whatif_s is None or solver.time_limit_s is None:
        return given
    return (f"{given}: {format_seconds(solver.whatif_s)} to the what-if rows, "
            f"{format_seconds(solver.time_limit_s)} to this solve")


def critical_text(ov: Overview) -> str:
    nodes = sum(1 for s in ov.critical_path if s.kind == "node")
    transfers = len(ov.critical_path) - nodes
    idle = ov.makespan_s - ov.critical_compute_s - ov.critical_transfer_s
    idle = idle if idle > 1e-6 * ov.makespan_s else 0.0  # rounding, not waiting
    return (f"{nodes} node{'s' if nodes != 1 else ''} ({format_seconds(ov.critical_compute_s)})"
            f", {transfers} transfer{'s' if transfers != 1 else ''} "
            f"({format_seconds(ov.critical_transfer_s)}), idle {format_seconds(idle)}")


def verification_text(ov: Overview) -> str | None:
    verification = ov.verification
    if not verification:
        return None
    diff = verification.max_abs_diff
    return verification.status + (f", max |diff| {diff:.3g}" if diff is not None else "")


def pins_text(ov: Overview) -> str | None:
    """``"model.0 -> cuda:0, model.4 -> cuda:1: pins cost 0.31 ms (12%) against the unpinned
    plan (2.61 ms)"``, for a plan with pins."""
    if ov.pins is None or ov.pins_cost_s is None:
        return None
    free_s = ov.pins.unpinned_objective_s
    share = f" ({ov.pins_cost_s / free_s:.0%})" if free_s > 0 else ""
    return (f"{pin_list(ov.pins.modules)}: pins cost {format_seconds(ov.pins_cost_s)}"
            f"{share} against the unpinned plan ({format_seconds(free_s)})")


def training_text(ov: Overview) -> str | None:
    """``"adam, 1 micro-batch (gpipe), 1 replica; training check passed"``, for a training
    plan."""
    if ov.training is None:
        return None
    return f"{ov.training.text}; training check {ov.training.check}"


def tensor_text(ov: Overview) -> str | None:
    """``"tp 2 over cpu:0, cpu:1: 58.1 ms predicted, the placement kept; outputs checked on 2
    gloo ranks, 62.1 ms measured there"``, for a plan with a tensor-parallel candidate (a
    training plan's: ``"tp 2 over ...: training step (every rank on the whole batch) 7.9 ms
    predicted, the plan faster; 3 adam steps checked on 2 gloo ranks, ..."``)."""
    tp = ov.tensor_parallel
    if tp is None:
        return None
    training = tp.optimizer is not None
    script = f"tensor_parallel/{'train' if training else 'launch'}.py"
    kept = (f"{unplaced(ov.solver)}, and this is the plan: its ranks run from {script}"
            if ov.solver.name == MESH_SOLVER else
            f"rank 0 over memory by {format_bytes(tp.over_bytes)}" if not tp.fits else
            f"faster: its ranks run from {script}" if tp.makespan_s < ov.makespan_s
            else f"the {'plan' if training else 'placement'} faster")
    checked = (f"; 3 {tp.optimizer} steps checked on {tp.world} gloo ranks" if training
               else f"; outputs checked on {tp.world} gloo ranks")
    batch = (f"each tp group on 1/{tp.dp} of the batch" if tp.dp > 1
             else "every rank on the whole batch")
    where = (", ".join(tp.devices) if len(tp.devices) <= 8 else  # a cluster's: the ends
             f"{tp.devices[0]}, ..., {tp.devices[-1]} ({len(tp.devices)} devices)")
    return (f"{tp.mesh_text} over {where}: "
            + (f"training step ({batch}) {format_seconds(tp.makespan_s)}"
               if training else format_seconds(tp.makespan_s))
            + f" predicted, {kept}"
            + (checked if tp.check == "passed" else "")
            + (f", {format_seconds(tp.measured_s)} measured there"
               if tp.measured_s is not None and all(
                   d.torch_device.startswith("cpu") for d in ov.devices if d.name in tp.devices)
               else ""))


def generation_text(ov: Overview) -> str | None:
    """``"16 tokens after 4 prompts of 64: prompt 126.8 ms, then 11.10 ms a token (360.3
    tokens/s), 293.3 ms in all; cache 1.2 MiB on cpu:0, ...; the emitted model's tokens equal
    generate()'s"``, for a generation plan."""
    gen = ov.generation
    if gen is None:
        return None
    cache = ", ".join(f"{format_bytes(b)} on {d}" for d, b in gen.cache_bytes.items() if b)
    return (f"{gen.new_tokens} tokens after {gen.batch} prompt(s) of {gen.prompt_tokens}: "
            f"prompt {format_seconds(gen.prefill_s)}, then {format_seconds(gen.step_s)} a "
            f"token ({gen.tokens_per_s:.1f} tokens/s), {format_seconds(gen.total_s)} in all; "
            f"key-value cache {cache or 'none'}"
            + ("; the emitted model's tokens equal generate()'s" if gen.check == "passed"
               else ""))


def _facts(ov: Overview) -> Any:
    """The summary's first table: the plan's facts, one per row."""
    from rich.table import Table
    from rich.text import Text

    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="dim", no_wrap=True)
    facts.add_column()
    facts.add_row("devices", f"{', '.join(d.name for d in ov.devices)} ({ov.devices_text})")
    if ov.training is not None:
        facts.add_row("training step", training_text(ov))
    if ov.generation is not None:
        facts.add_row("generation", Text(generation_text(ov), style="bold"))
    facts.add_row("makespan" if ov.generation is None else "summed makespan",
                  Text(format_seconds(ov.makespan_s), style="bold"))
    if ov.value_label != "makespan":
        facts.add_row(ov.value_label, Text(format_seconds(ov.value_s), style="bold"))
    facts.add_row("speed-up", speedup_text(ov))
    facts.add_row("lower bound", "none proven for a tensor-parallel mesh" if ov.gap is None
                  else f"{format_seconds(ov.lower_bound_s)} ({gap_text(ov)})")
    facts.add_row("solver", solver_text(ov))
    facts.add_row("costs", ov.costs_text)
    facts.add_row("critical path", critical_text(ov))
    if ov.pins is not None:
        facts.add_row("pins", pins_text(ov))
    if ov.tensor_parallel is not None:
        facts.add_row("tensor parallel", tensor_text(ov))
    verified = verification_text(ov)
    if verified:
        style = {"passed": "green", "failed": "bold red"}.get(ov.verification.status, "")
        facts.add_row("verification", Text(verified, style=style))
    return facts


def summary_renderable(plan: Plan | Overview) -> Any:
    """The summary as a group of ``rich`` tables (of ``plan``, or of its overview when the
    caller has it already)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    ov = plan if isinstance(plan, Overview) else overview(plan)
    facts = _facts(ov)

    def table(title: str, *columns: str) -> Table:
        # A header of several words goes on two lines where the table is wide (cells never
        # wrap), so that every table fits 80 columns.
        wide = len(columns) > 5
        t = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                  pad_edge=False)
        for i, name in enumerate(columns):
            t.add_column(name.replace(" ", "\n", 1) if wide else name,
                         justify="right" if i else "left", no_wrap=True)
        return t

    memory = table("memory", "device", "peak / capacity", "parameters", "runtime reserve")
    for m in ov.memory:
        over = "  OVER CAPACITY" if m["over"] else ""
        memory.add_row(m["device"], Text(
            f"{format_bytes(m['peak_bytes'])} / {format_bytes(m['capacity_bytes'])} "
            f"({format_share(m['fraction'])}){over}", style="bold red" if m["over"] else ""),
            format_bytes(m["parameter_bytes"]), format_bytes(m["reserved_bytes"]))

    baselines = table("baselines (same simulator)", "placement", ov.value_label,
                      "plan's speed-up", "fits memory")
    baselines.add_row("autoplace plan", format_seconds(ov.value_s), "", "yes", style="bold")
    for c in ov.comparisons:
        baselines.add_row(c.name, format_seconds(c.value_s) if c.value_s is not None
                          else c.missing_text,
                          format_ratio(c.speedup), c.fits_text)
    parts: list[Any] = [
        Text(ov.advice, style="bold"),
        Text(f"autoplace plan for {ov.model} (objective: {ov.objective})", style="bold"),
        facts, Text(""), memory]
    if ov.training is not None:
        step = table(f"training step: {training_text(ov)}", "device", "parameters",
                     "gradients", "optimizer state", "activations", "runtime reserve", "peak")
        for m in ov.memory:
            step.add_row(m["device"], *(format_bytes(m[key]) for key in (
                "parameter_bytes", "gradient_bytes", "optimizer_state_bytes",
                "activation_bytes", "reserved_bytes", "peak_bytes")))
        parts.append(step)
    parts.append(baselines)
    if ov.device_map is not None:
        parts.append(_device_map_table(ov, table))
    if ov.whatif is not None:
        whatif = table("what-if: the first k devices", "devices", ov.value_label, "speed-up",
                       "status")
        for row in ov.whatif:
            whatif.add_row(f"{len(row.devices)}: {', '.join(row.devices)}",
                           format_seconds(row.value_s) if row.value_s is not None
                           else "does not fit", format_ratio(row.speedup_over_first),
                           row.status, style="bold" if row.is_plan else "")
        parts.append(whatif)
    for note in ov.notes:
        parts.append(Text(f"note: {note}", style="dim"))
    return Group(*parts)


def _device_map_table(ov: Overview, table: Any) -> Any:
    """The device_map beside accelerate's: makespan, peaks, where a map overflows."""
    maps = table("device_map.json beside accelerate's maps (activations counted)", "map",
                 "makespan", "peak per device", "memory")
    for c in ov.device_map.columns:
        if c.makespan_s is None:
            maps.add_row(c.name, "n/a", "", c.note or "")
            continue
        over = ", ".join(f"{d} by {format_bytes(b)}" for d, b in c.over)
        maps.add_row(c.name, format_seconds(c.makespan_s),
                     ", ".join(format_bytes(b) for b in c.peak_bytes.values()),
                     f"OVERFLOWS {over}" if over else "fits",
                     style="bold red" if over else "")
    return maps


def print_summary(plan: Plan, *, console: Any = None) -> None:
    """Print the summary to the terminal (plain text when stdout is not a terminal)."""
    from rich.console import Console

    (console or Console(highlight=False)).print(summary_renderable(plan))


def summary_text(plan: Plan | Overview, *, width: int = 100) -> str:
    """The summary as plain text, ``width`` columns wide (what ``summary.txt`` holds)."""
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, record=True, color_system=None,
                      highlight=False)
    console.print(summary_renderable(plan))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()).strip("\n")
