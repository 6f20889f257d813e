"""The ``autoplace`` command line: ``plan``, ``solve``, ``profile``, ``devices``, ``report`` and
``run``.

``main(argv)`` returns the exit code: 0 on success, 2 for any ``AutoplaceError`` (bad input, a
model that does not fit, an unwritable output directory), printed as one paragraph with no
traceback, and 130 on Ctrl-C. ``autoplace run`` lives beside it: ``run.py`` (one process) and
``run_ranks.py`` (``--nproc``, a process per device).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager

from autoplace.cli import run_generate
from autoplace.cli.flags import replicas_flag, tp_flag
from autoplace.cluster import DEFAULT_SIMULATED_SPEC
from autoplace.config import (
    Fsdp,
    Granularity,
    Layers,
    Mode,
    Objective,
    PipelineSchedule,
    Recompute,
)
from autoplace.config.defaults import (
    DEFAULT_MAX_NODES,
    DEFAULT_MIN_GAIN,
    DEFAULT_TIME_LIMIT_S,
    MODULE_TIME_LIMIT_S,
)
from autoplace.errors import AutoplaceError, ConfigError
from autoplace.solve import SOLVERS
from autoplace.train import OPTIMIZERS

__all__ = ["main"]

_DESCRIPTION = """\
Automatic device placement for PyTorch models.

  autoplace plan examples/mlp.py --devices 2xA100-40GB
  autoplace solve examples/graphs/diamond.json --objective throughput
  autoplace profile examples/mlp.py --devices cpu
  autoplace devices
  autoplace report autoplace-out/plan.json
  autoplace run autoplace-out --repeats 10
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoplace", description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    from autoplace import __version__

    parser.add_argument("--version", action="version", version=f"autoplace {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "plan", help="trace a model file, solve for a placement, emit and verify the split model",
        description="Trace MODEL_FILE, cost every op on every device, solve for the placement "
        "with minimum makespan (CP-SAT, checked against heuristics on one simulator), emit the "
        "partitioned model and verify it against the original. MODEL_FILE is run as Python: it "
        "defines build() returning (model, example_inputs), or module-level model and "
        "example_inputs. Writes OUT/plan.json, OUT/report.html, OUT/summary.md, OUT/summary.txt "
        "and OUT/model/.")
    p.add_argument("model_file", metavar="MODEL_FILE", help="Python file defining the model")
    p.add_argument("--devices", metavar="SPEC",
                   help="devices to plan for, e.g. 2xA100-40GB,2xT4-16GB or cuda:0,cuda:1; "
                   "default: the GPUs found, or the simulated set "
                   f"{DEFAULT_SIMULATED_SPEC} when there are none (`autoplace devices` lists "
                   "the types)")
    p.add_argument("--cluster", metavar="FILE",
                   help="TOML file describing hosts, devices and links (instead of --devices)")
    p.add_argument("--max-nodes", type=int, default=None,
                   help="the largest graph CP-SAT solves whole: a larger (folded) graph is "
                   "coarsened to about this many nodes for CP-SAT's first pass; the plan, its "
                   "bound and the baselines are of the folded graph "
                   f"(default: {DEFAULT_MAX_NODES}; at --granularity module, CP-SAT's own "
                   "limit)")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="run the original and the emitted model on the example inputs and check "
                   "them with torch.testing.assert_close (default: on)")
    p.add_argument("--check-memory", action=argparse.BooleanOptionalAction, default=None,
                   help="while verifying, the emitted model's peak bytes per device are "
                   "measured and recorded; with --check-memory a device above the plan's figure "
                   "fails verification (default: off until the plan's memory figure is an "
                   "upper bound, autoplace.emit.ENFORCE_PEAK_DEFAULT)")
    p.add_argument("--emit", action=argparse.BooleanOptionalAction, default=True,
                   help="write the partitioned model to OUT/model (default: on)")
    p.add_argument("--mode", choices=tuple(Mode), default="inference",
                   help="inference: one forward pass (default); training: one training step "
                   "of one batch, forward, backward and optimizer step, each layer's three on "
                   "one device. The model file defines loss(outputs, *targets) and "
                   "example_targets, or the model returns its scalar loss; the emitted model "
                   "is trained beside the original for 3 steps and must match it (losses, "
                   "gradients, parameters)")
    p.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="adam",
                   help="with --mode training: the optimizer whose state and update are "
                   "planned (default: adam)")
    p.add_argument("--dtype", default="float32", metavar="DTYPE",
                   help="float32 (default), bfloat16 or float16 (fp32, bf16, fp16): the model's "
                   "floating parameters, buffers, inputs and targets are cast to it before "
                   "tracing, so the plan's bytes and costs are that dtype's. With --mode "
                   "training a half dtype is mixed precision: float32 master weights updated "
                   "by the optimizer (Adam: 16 bytes per parameter in all), float16 with "
                   "torch.amp.GradScaler's dynamic loss scale. tf32: float32, its matmuls and "
                   "convolutions priced on the GPUs' TF32 tensor cores (default: as torch's "
                   "settings say; the emitted model does not turn TF32 on)")
    p.add_argument("--microbatches", type=int, default=1, metavar="M",
                   help="with --mode training: cut the batch into M equal micro-batches (M "
                   "must divide it) and pipeline them over the devices (default: 1); the "
                   "batch's loss must be the mean or the sum of theirs, which is checked")
    p.add_argument("--replicas", type=replicas_flag, default="auto", metavar="R",
                   help="with --mode training: R data-parallel replicas (DistributedDataParallel,"
                   " or with --microbatches each replica's micro-batches in the plan's order and "
                   "then the gradients' all-reduce; one process each, OUT/train.py under "
                   "torchrun), each placed on N/R of the "
                   "N devices with 1/R of the batch; auto (default) plans every R that divides "
                   "the devices into alike groups and keeps the fastest step, the gradients' "
                   "all-reduce included")
    p.add_argument("--generate", type=int, metavar="N",
                   help="plan greedy generation of N tokens after the example input_ids (a "
                   "causal LM's prompt), each layer's static key-value cache on its device; "
                   "the emitted model generates the original's tokens (docs/generation.md)")
    p.add_argument("--tp", type=tp_flag, metavar="N|auto",
                   help="weigh N tensor-parallel ranks (one device each, the first N; auto: "
                   "each N dividing the leading alike devices of one host, the fastest kept) "
                   "beside the placement: matmuls split as columns and rows, run by DTensor, "
                   "simulated with its collectives, checked on N gloo ranks; written to "
                   "OUT/tensor_parallel/ (`autoplace run OUT --nproc N --tensor-parallel`). "
                   "With --mode training: each rank's step on the whole batch, checked by 3 "
                   "steps (run with --train K), weighed first: a placement whose lower bound "
                   "is no less is not solved, one slower is not the plan; the recipes written "
                   "by hand (DDP, FSDP, Megatron-style, FSDP + TP) are its baselines "
                   "(docs/concepts.md, docs/training.md)")
    p.add_argument("--dp", type=tp_flag, metavar="N|auto",
                   help="with --tp T: the candidate is a dp x tp mesh of every device (N x T "
                   "of them), each tp group on 1/N of the batch, checked on N x T gloo ranks; "
                   "with --mode training the model sharded over dp by FSDP2 (--fsdp on), its "
                   "gradients averaged (off) or the faster of the two (auto); auto: dp 1 "
                   "(tp on the leading devices) and the mesh of every device weighed, the "
                   "fastest kept")
    p.add_argument("--pp", type=tp_flag, metavar="N|auto",
                   help="with --tp T: a pp x tp mesh, the model cut into N pipeline stages, each "
                   "run by T ranks (torch.distributed.pipelining; N x T gloo ranks); in "
                   "training its --microbatches in --schedule's order; auto: each N of 2 or "
                   "more whose N x T devices are there, the fastest kept")
    p.add_argument("--fsdp", choices=tuple(Fsdp), default="auto",
                   help="with --mode training: whether the data-parallel replicas shard "
                   "parameters, gradients and optimizer state (FSDP2's fully_shard per block, "
                   "ZeRO-3; one device and one batch a replica): auto (default) where a replica "
                   "count's DDP step does not fit, the faster step that fits kept; on: only "
                   "sharded replicas; off: never")
    p.add_argument("--layers", choices=tuple(Layers), default="train",
                   help="with --mode training: how the step runs the layers: train (default: "
                   "as users train, dropout on and batch norm normalizing by the batch and "
                   "updating its running statistics; checked with dropout's probabilities set "
                   "to zero) or eval (dropout off, batch norm on its running statistics: the "
                   "losses compared exactly)")
    p.add_argument("--schedule", choices=tuple(PipelineSchedule), default="auto",
                   help="with --microbatches: the order each device runs the micro-batches "
                   "in: gpipe (every forward, then every backward), 1f1b (one forward, one "
                   "backward, after a warm-up; fewer activations held), or auto (default: "
                   "solve both with half the time each, keep the faster step)")
    p.add_argument("--recompute", choices=tuple(Recompute), default="auto",
                   help="with --microbatches: recompute each micro-batch's forward in its "
                   "backward on a device, keeping only the inputs it received, at the cost of "
                   "one more forward: auto (default) where a placement overflows a device "
                   "without it, all on every device, off never; auto also recomputes each "
                   "block of a --tp mesh whose rank 0 fits no other way")
    p.add_argument("--granularity", choices=tuple(Granularity), default="op",
                   help="op: place every traced op and emit the partitioned model (default); "
                   "module: place whole modules and write OUT/device_map.json, a Hugging Face "
                   "device_map that from_pretrained(..., device_map=...) and accelerate's "
                   "dispatch_model take, next to accelerate's own maps in the report (the "
                   "model runs once instead of being traced op by op; analytic costs; no "
                   "OUT/model/; inference only; --time-limit defaults to "
                   f"{MODULE_TIME_LIMIT_S:g} s)")
    p.add_argument("--no-split", action="append", metavar="CLASS",
                   help="with --granularity module: a module class kept whole on one device "
                   "(repeat for several; default: the model's _no_split_modules; a class the "
                   "model does not use is an error)")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                   help="measure op times and links on the devices that are here, and use "
                   "calibrated costs for the others where the profile cache has a fit "
                   "(default: on; with no device here, nothing is measured)")
    p.add_argument("--pin", action="append", default=[], metavar="MODULE=DEVICE",
                   help="fix a module's ops and parameters to a device, the rest placed by the "
                   "solver (repeatable): MODULE as in model.named_modules() (model.layers.0; "
                   "0 in an nn.Sequential), DEVICE a planned device (cuda:1, cpu) or an "
                   "integer, the i-th GPU. The model is also solved without pins, and the "
                   "summary says what the pins cost. Inference plans only. With "
                   "--granularity module a pin inside a module kept whole pins all of it")
    p.add_argument("--pin-map", metavar="FILE",
                   help="pins as a partial Hugging Face device_map JSON, e.g. "
                   '{"model.embed_tokens": 0, "lm_head": "cpu"}; joins --pin')
    p.add_argument("--checkpoint", metavar="PATH",
                   help="the model's weights: a .safetensors file, or a directory written by "
                   "save_pretrained (model.safetensors, or shards listed by "
                   "model.safetensors.index.json). Every tensor is checked first (the missing "
                   "and mis-shaped are named, nothing is written); the weights are loaded into "
                   "the model (one built on the meta device too, where it fits in memory; "
                   "otherwise it is emitted unverified), and "
                   "OUT/model refers to the checkpoint instead of copying it: load_model reads "
                   "each segment's tensors from it straight onto the segment's device, and "
                   "refuses a checkpoint changed since (size, modification time, index). "
                   "Buffers it lacks (rotary inv_freq) are the model's, saved in OUT/model")
    _cache_option(p)
    _solve_options(p)

    pr = sub.add_parser(
        "profile", help="measure a model's ops on the devices here, and calibrate",
        description="Trace MODEL_FILE and time every op on each device of --devices that is "
        "on this machine (CUDA events on GPUs, a monotonic clock on the CPU; the median after "
        "warm-up), the whole forward pass for comparison, and the links between the devices. "
        "Measurements go to the profile cache (docs/profiling.md) and refit the calibrated "
        "roofline, which predicts the devices that are not here.")
    pr.add_argument("model_file", metavar="MODEL_FILE", help="Python file defining the model")
    pr.add_argument("--devices", metavar="SPEC",
                    help="devices to profile, e.g. cpu or cuda:0,cpu (default: cpu and the GPUs "
                    "found)")
    _cache_option(pr)
    _quiet_option(pr)

    g = sub.add_parser(
        "solve", help="place a task graph given as JSON (no model to trace)",
        description="Place the task graph in GRAPH_JSON (nodes with compute time per device "
        "name or type and resident bytes, edges with bytes or a fixed transfer time, optional "
        "colocation groups and pinned devices, devices and links; see docs/graph-format.md). "
        "Writes OUT/plan.json and the report, as `plan` does, without a model.")
    g.add_argument("graph_file", metavar="GRAPH_JSON", help="task graph in autoplace's JSON "
                   "format")
    g.add_argument("--devices", metavar="SPEC",
                   help="devices to plan for instead of the file's, e.g. 4xA100-40GB (node "
                   "compute times are then looked up by device type)")
    g.add_argument("--cluster", metavar="FILE", help="TOML cluster file instead of the file's "
                   "devices")
    _solve_options(g)

    d = sub.add_parser("devices", help="list the device catalog and the GPUs found",
                       description="List the device types autoplace knows (with their peak "
                       "FLOP/s, memory bandwidth and memory) and the GPUs found on this machine.")
    del d

    r = sub.add_parser("report", help="re-render the report from a plan.json",
                       description="Re-render report.html, summary.md and summary.txt next to "
                       "PLAN_JSON from the plan file alone (no model, no solving).")
    r.add_argument("plan_json", metavar="PLAN_JSON", help="a plan.json, or its directory")
    _run_parser(sub)
    return parser


def _run_parser(sub: argparse._SubParsersAction) -> None:
    u = sub.add_parser(
        "run", help="run an emitted model; measured time and memory against the plan's",
        description="Load OUT/model (planned devices not on this machine run on the CPU, and "
        "the output says so), run it on the example inputs saved with it or on --inputs, and "
        "print the median time against the plan's predicted makespan, and the peak bytes per "
        "device (weights + live activations) against the plan's predicted peak.")
    u.add_argument("out", metavar="OUT", help="an output directory of `autoplace plan`")
    u.add_argument("--inputs", metavar="FILE.safetensors",
                   help="inputs instead of the saved example: one tensor per example input, "
                   "named args.0, args.1, ..., kwargs.NAME, of the example's shapes and dtypes")
    u.add_argument("--train", type=int, metavar="STEPS",
                   help="for a --mode training plan: train the emitted model STEPS steps on "
                   "its example inputs and targets with the plan's optimizer, and print the "
                   "losses and the step time against the plan's; a plan of R data-parallel "
                   "replicas trains them as R processes (OUT/train.py under torchrun), each on "
                   "1/R of the batch; with --nproc N --tensor-parallel, the plan's "
                   "tensor-parallel candidate (--tp N) as N ranks, each on the whole batch "
                   "(OUT/tensor_parallel/train.py)")
    u.add_argument("--lr", type=float, metavar="RATE",
                   help="with --train: the learning rate (default: the optimizer's torch "
                   "default)")
    u.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="untimed passes first (default: 1)")
    u.add_argument("--repeats", type=int, default=5, metavar="N",
                   help="timed passes; the median is reported (default: 5)")
    u.add_argument("--json", action="store_true",
                   help="print one JSON object: measured_s, predicted_s, peak_bytes (device -> "
                   "measured), predicted_peak_bytes, and the details (with --train: losses, "
                   "measured_s, predicted_s, times_s, and the details)")
    u.add_argument("--save-outputs", metavar="FILE.safetensors",
                   help="write the model's output tensors (output, output.0, output.NAME, "
                   "...); with --nproc, rank 0's, once checked (the batch's: M micro-batches' "
                   "rows one after another)")
    run_generate.add_arguments(u)  # a generation plan's tokens (cli/run_generate.py)
    # More than one process (autoplace/cli/run_ranks.py, docs/multiprocess.md).
    u.add_argument("--nproc", type=int, metavar="N",
                   help="run an inference plan as N processes on this machine, one per planned "
                   "device (OUT/launch.py under torchrun, gloo on 127.0.0.1, nccl on GPUs): "
                   "check rank 0's outputs against the one-process model and print the time "
                   "per batch against the plan's")
    u.add_argument("--microbatches", type=int, default=1, metavar="M",
                   help="with --nproc: a batch of M micro-batches, each of the planned "
                   "example's shape (--inputs then holds M times its rows; default: the "
                   "example M times), pipelined in GPipe's order: torch.distributed."
                   "pipelining's ScheduleGPipe where the ranks form a chain of stages, "
                   "send/recv otherwise; predicted by simulating M copies (default: 1)")
    u.add_argument("--tensor-parallel", action="store_true",
                   help="with --nproc N: run the plan's tensor-parallel candidate (planned with "
                   "--tp N) as N ranks instead (OUT/tensor_parallel/launch.py: DTensor, the "
                   "matmuls split as plan.json's tensor_parallel.split says): check rank 0's "
                   "outputs against the one-device model it splits and print the time per "
                   "pass against tensor_parallel.makespan_s")
    u.add_argument("--device-map", metavar="JSON",
                   help="with --nproc: where the ranks run, as load_model's device_map (globs "
                   "of planned torch devices, the first match wins), e.g. "
                   "'{\"cuda:*\": \"cpu\"}' to rehearse a GPU plan on CPU ranks (default: "
                   "the planned devices, those absent here on the CPU)")


def _cache_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", action=argparse.BooleanOptionalAction, default=True,
                   help="keep and reuse measurements in the profile cache, "
                   "$AUTOPLACE_CACHE_DIR or ~/.cache/autoplace/profile.sqlite3 (default: on; "
                   "--no-cache measures everything again and keeps nothing)")


def _quiet_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true",
                   help="no progress display: by default a terminal shows on stderr the stage "
                   "running and, while solving, the best plan and bound so far with the time "
                   "left, erased before the summary (never shown when stderr is not a terminal)")


def _progress(args: argparse.Namespace) -> AbstractContextManager[object]:
    """The live display on stderr for the command's work (``autoplace.progress``): none with
    ``--quiet`` or when stderr is not a terminal."""
    from autoplace.progress import live_reporter, reporting

    return reporting(None if args.quiet else live_reporter())


def _solve_options(p: argparse.ArgumentParser) -> None:
    """The options ``plan`` and ``solve`` share: output and how to solve."""
    p.add_argument("--out", metavar="DIR", default="autoplace-out",
                   help="output directory, replaced atomically (default: ./autoplace-out)")
    _quiet_option(p)
    p.add_argument("--time-limit", metavar="SECONDS", type=float, default=None,
                   help=f"solver time limit in seconds (default: {DEFAULT_TIME_LIMIT_S:g}; "
                   f"{MODULE_TIME_LIMIT_S:g} for plan --granularity module); plan's what-if "
                   "rows on fewer devices (inference) take at most half of it")
    p.add_argument("--solver", choices=SOLVERS, default="cpsat",
                   help="cpsat (default) or one of the heuristics alone")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (default: 0)")
    p.add_argument("--objective", choices=tuple(Objective), default="latency",
                   help="latency: minimise the makespan of one pass (default); throughput: "
                   "minimise the busiest device's load (compute plus copies sent and received) "
                   "for pipelined execution")
    p.add_argument("--contiguous", action="store_true",
                   help="make the devices' node sets a chain of pipeline stages (no path leaves "
                   "a device and comes back, no two devices feed each other)")
    p.add_argument("--min-gain", metavar="FRACTION", type=float, default=DEFAULT_MIN_GAIN,
                   help="split only when it is at least this much faster than the best single "
                   "device, otherwise the plan is that device and says why (a fraction in "
                   f"[0, 1); default: {DEFAULT_MIN_GAIN:g}, about the run-to-run noise of a "
                   "measured forward pass)")
    p.add_argument("--deterministic", action="store_true",
                   help="same input and same costs, same plan: one CP-SAT worker, with "
                   "--time-limit counted in CP-SAT's deterministic seconds rather than wall "
                   "seconds (with profiling, reuse the cache: --no-cache or an empty cache "
                   "measures again)")


def _cmd_solve(args: argparse.Namespace) -> int:
    from autoplace.cli.flags import solve_of
    from autoplace.config import Devices
    from autoplace.formats.graph import load_graph_file
    from autoplace.formats.output import check_writable
    from autoplace.pipeline import save, solve_graph
    from autoplace.progress import stage
    from autoplace.report import print_summary

    began = time.perf_counter()
    devices, solving = Devices(spec=args.devices, file=args.cluster), solve_of(args)
    out = check_writable(args.out)
    cluster, notes = None, []
    if args.devices or args.cluster:  # otherwise the graph file's own devices
        cluster, notes = devices.resolve()
    with _progress(args):
        stage("load")
        problem = load_graph_file(args.graph_file, cluster=cluster)
        stage("solve")
        result = solve_graph(problem, solving, notes=notes)
        stage("report")
        save(result, out)
    print_summary(result)
    print(f"wrote {out}/plan.json and the report in {time.perf_counter() - began:.1f} s")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from autoplace.cli.flags import config_of
    from autoplace.config import Granularity
    from autoplace.formats.output import check_writable
    from autoplace.pipeline import plan, save
    from autoplace.progress import stage
    from autoplace.report import print_summary
    from autoplace.trace.load import load_model_file

    began = time.perf_counter()
    config = config_of(args)
    out = check_writable(args.out)
    module = config.granularity == Granularity.MODULE
    if config.cost.profile and not module:
        config = replace(config, cost=replace(config.cost, cache=_cache(args)))
    with _progress(args):
        stage("load")
        loaded = load_model_file(args.model_file)
        planned = plan(loaded.model, loaded.kwargs or loaded.args,
                       replace(config, name=loaded.name), loss=loaded.loss,
                       example_targets=loaded.targets)
        stage("report")
        save(planned, out)
    print_summary(planned.plan)
    written = ("device_map.json, plan.json" if module else "plan.json") + (
        ", report.html, summary.md, summary.txt")
    print(f"wrote {out}/{written}" + (", model/" if planned.model is not None else "")
          + (", tensor_parallel/" if planned.tensor_model is not None else "")
          + f" in {time.perf_counter() - began:.1f} s")
    return 0


def _cache(args: argparse.Namespace):  # noqa: ANN202 - autoplace.profile is imported lazily
    from autoplace.profile import open_cache

    return open_cache(use_cache=args.cache)


def _cmd_profile(args: argparse.Namespace) -> int:
    from autoplace.cluster import describe_present, inventory, present_devices, resolve_cluster
    from autoplace.emit.codegen.source import runtime_namespace
    from autoplace.profile import profile_model
    from autoplace.progress import stage
    from autoplace.trace import trace_model
    from autoplace.trace.load import load_model_file

    inv = inventory()
    everything_here = ",".join(["cpu", *(f"cuda:{g.index}" for g in inv.gpus)])
    cluster, spec_notes = resolve_cluster(spec=args.devices or everything_here, gpus=inv.gpus)
    present, absent = present_devices(cluster, inv)
    if not present:
        from autoplace.errors import DeviceSpecError

        here, _ = resolve_cluster(spec=everything_here, gpus=inv.gpus)
        raise DeviceSpecError(
            f"nothing to profile: {'; '.join(absent)}. Devices here: "
            f"{describe_present(here.devices)}. Profile those (e.g. --devices cpu), or plan "
            "for the devices you named with `autoplace plan`, which predicts them with the "
            "calibrated roofline where the profile cache has a fit for their kind")
    began = time.perf_counter()
    with _progress(args), _cache(args) as cache:
        stage("load")
        loaded = load_model_file(args.model_file)
        model = loaded.model.eval()
        stage("trace")
        traced = trace_model(model, loaded.args, loaded.kwargs, name=loaded.name)
        stage("profile")
        result = profile_model(traced, model, loaded.args, loaded.kwargs, cluster,
                               cache=cache, progress=not args.quiet, inv=inv,
                               engine=runtime_namespace())
    for line in inv.lines() + result.lines():
        print(line)
    for note in (*spec_notes, *result.notes):
        print(f"note: {note}")
    where = result.cache.get("path") or "memory only (--no-cache)"
    print(f"profiled in {result.wall_s:.1f} s ({time.perf_counter() - began:.1f} s with "
          f"loading and tracing); cache: {where}")
    return 0


def _cmd_devices(args: argparse.Namespace) -> int:
    from autoplace.cluster import detect_gpus, format_catalog

    print(format_catalog(detect_gpus()))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from autoplace.errors import OutputError
    from autoplace.formats.plan import plan_path, read_plan
    from autoplace.report import print_summary, write_report

    # Checked against the schema first: a bad file is one clear paragraph, and nothing is
    # written; write_report renders everything, then replaces the three files together.
    path = plan_path(args.plan_json)
    planned = read_plan(path)
    try:
        write_report(path.parent, planned)
    except OSError as exc:
        raise OutputError(f"cannot write the report next to {str(path)!r}: {exc}; copy "
                          "the plan file to a writable directory and run this there") from exc
    print_summary(planned)
    print(f"wrote {path.parent}/report.html, summary.md, summary.txt")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import json

    from autoplace.cli.run import run_plan, save_outputs, train_plan

    if args.generate is not None:
        return run_generate.command(args)
    if args.train is None and args.lr is not None:
        raise AutoplaceError("--lr goes with --train STEPS (the learning rate of that training)")
    if args.train is not None and (args.inputs or args.save_outputs):
        raise AutoplaceError("--train trains on the plan's example inputs and targets: it takes "
                             "neither --inputs nor --save-outputs")
    if args.nproc is not None:
        return _run_ranks(args)
    if args.tensor_parallel:
        raise AutoplaceError("--tensor-parallel goes with --nproc N (the candidate's ranks, "
                             "one process each)")
    if args.microbatches != 1:
        raise AutoplaceError("--microbatches goes with --nproc N (an inference plan run as N "
                             "processes); a training plan's micro-batches are planned")
    if args.device_map is not None:
        raise AutoplaceError("--device-map goes with --nproc N (the ranks' devices); one "
                             "process runs planned devices absent here on the CPU already")
    if args.train is not None:
        trained = train_plan(args.out, steps=args.train, lr=args.lr)
        print(json.dumps(trained.to_dict()) if args.json else "\n".join(trained.lines()))
        return 0
    result = run_plan(args.out, inputs_file=args.inputs, warmup=args.warmup,
                      repeats=args.repeats)
    written = save_outputs(result.outputs, args.save_outputs) if args.save_outputs else []
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    for line in result.lines():
        print(line)
    if written:
        print(f"wrote {len(written)} output tensor(s) to {args.save_outputs}")
    return 0


def _run_ranks(args: argparse.Namespace) -> int:
    """``autoplace run OUT --nproc N``."""
    import json

    from autoplace.cli.run_ranks import run_ranks
    from autoplace.emit.device_map import parse_device_map

    if args.train is not None and not args.tensor_parallel:
        raise AutoplaceError("--nproc runs an inference plan as processes: it takes no "
                             "--train (`--train STEPS` alone runs a training plan's replicas "
                             "as processes; with --tensor-parallel, its tensor-parallel "
                             "candidate's ranks)")
    device_map = None if args.device_map is None else parse_device_map(args.device_map)
    if args.tensor_parallel:
        from autoplace.cli.run_tensor import run_tensor, train_tensor

        if args.inputs or args.microbatches != 1:
            raise AutoplaceError("--tensor-parallel runs the saved example inputs once a pass: "
                                 "it takes neither --inputs nor --microbatches")
        if args.train is not None:
            trained = train_tensor(args.out, nproc=args.nproc, steps=args.train, lr=args.lr,
                                   device_map=device_map)
            print(json.dumps(trained.to_dict()) if args.json else "\n".join(trained.lines()))
            return 0
        result = run_tensor(args.out, nproc=args.nproc, warmup=args.warmup,
                            repeats=args.repeats, device_map=device_map,
                            outputs_file=args.save_outputs)
    else:
        result = run_ranks(args.out, nproc=args.nproc, microbatches=args.microbatches,
                           inputs_file=args.inputs, warmup=args.warmup, repeats=args.repeats,
                           device_map=device_map, outputs_file=args.save_outputs)
    print(json.dumps(result.to_dict()) if args.json else "\n".join(result.lines()))
    if result.written and not args.json:
        print(f"wrote {len(result.written)} output tensor(s) to {args.save_outputs}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = {"plan": _cmd_plan, "solve": _cmd_solve, "profile": _cmd_profile,
               "devices": _cmd_devices, "report": _cmd_report, "run": _cmd_run}[args.command]
    try:
        return command(args)
    except ConfigError as exc:  # named by its flag, as the user wrote it
        from autoplace.cli.flags import FLAGS

        print(f"autoplace: error: {exc.render(FLAGS)}", file=sys.stderr)
        return 2
    except AutoplaceError as exc:
        print(f"autoplace: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autoplace: interrupted", file=sys.stderr)
        return 130

