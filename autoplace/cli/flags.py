"""The command line's flags as configuration fields: ``config_of`` builds the ``Config`` that
``autoplace plan``'s flags describe (``solve_of``, the ``Solve`` section of ``autoplace solve``),
and ``FLAGS`` names each field's flag, so that a ``ConfigError`` names what the user typed
(``--min-gain``, not ``solve.min_gain``)."""

from __future__ import annotations

import argparse

from autoplace.config import Config, Cost, Devices, Emit, Parallel, Solve, Training

__all__ = ["FLAGS", "config_of", "replicas_flag", "solve_of", "tp_flag"]

FLAGS = {
    "devices.spec": "--devices", "devices.file": "--cluster",
    "mode": "--mode", "granularity": "--granularity", "dtype": "--dtype",
    "no_split": "--no-split", "pins": "--pin/--pin-map", "checkpoint": "--checkpoint",
    "solve.time_limit_s": "--time-limit", "solve.solver": "--solver",
    "solve.objective": "--objective", "solve.contiguous": "--contiguous", "solve.seed": "--seed",
    "solve.deterministic": "--deterministic", "solve.max_nodes": "--max-nodes",
    "solve.min_gain": "--min-gain", "cost.profile": "--profile", "emit.model": "--emit",
    "emit.verify": "--verify", "emit.check_memory": "--check-memory",
    "training.optimizer": "--optimizer", "training.microbatches": "--microbatches",
    "training.schedule": "--schedule", "training.replicas": "--replicas",
    "training.recompute": "--recompute", "training.fsdp": "--fsdp", "training.layers": "--layers",
    "parallel.tp": "--tp", "parallel.dp": "--dp", "parallel.pp": "--pp", "generate": "--generate",
}


def solve_of(args: argparse.Namespace) -> Solve:
    """The ``Solve`` section of ``plan``'s and ``solve``'s shared flags."""
    return Solve(time_limit_s=args.time_limit, solver=args.solver, objective=args.objective,
                 contiguous=args.contiguous, seed=args.seed, deterministic=args.deterministic,
                 max_nodes=getattr(args, "max_nodes", None), min_gain=args.min_gain)


def config_of(args: argparse.Namespace, *, name: str = "model") -> Config:
    """``autoplace plan``'s configuration, checked before the model is loaded (``ConfigError``
    names the flag: ``cli.main`` renders it with ``FLAGS``). Pins are read from ``--pin`` and
    ``--pin-map`` (``solve.pins``); profiling goes with the profile cache's flags."""
    from autoplace.solve.pins import merge_pins, parse_pins, read_pin_map

    pins = merge_pins(parse_pins(args.pin), read_pin_map(args.pin_map) if args.pin_map else None)
    return Config(
        devices=Devices(spec=args.devices, file=args.cluster), mode=args.mode,
        granularity=args.granularity, dtype=args.dtype, solve=solve_of(args),
        cost=Cost(profile=args.profile, progress=args.profile and not args.quiet),
        training=Training(optimizer=args.optimizer, microbatches=args.microbatches,
                          schedule=args.schedule, replicas=args.replicas,
                          recompute=args.recompute, fsdp=args.fsdp, layers=args.layers),
        emit=Emit(model=args.emit, verify=args.verify, check_memory=args.check_memory),
        parallel=Parallel(tp=args.tp, dp=args.dp, pp=args.pp),
        pins=pins or None, checkpoint=args.checkpoint, no_split=args.no_split, name=name,
        generate=args.generate)


def replicas_flag(text: str) -> int | str:
    """``--replicas``: a whole number, or the text as given (``auto``; anything else is
    refused by ``config.Training``, with the plan's other errors)."""
    return int(text) if text.isdigit() else text


def tp_flag(text: str) -> int | str:
    """``--tp``'s, ``--dp``'s and ``--pp``'s value: ``auto`` or a whole number (``Parallel``
    checks it is 2 or more)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a whole number nor auto"
                                         ) from None
