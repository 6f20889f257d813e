"""Notes in one collector (``progress.notes``): a stage says a note where it finds it, the
innermost open collector keeps it, and a plan's notes are its collector's, in order."""

from __future__ import annotations

import torch

import autoplace
from autoplace import Config, Solve
from autoplace.progress.notes import collecting, note, note_all


def test_notes_go_to_the_innermost_collector_and_none_outside() -> None:
    note("said to no one")  # outside any collector: dropped, no error
    with collecting() as outer:
        note("a")
        with collecting() as inner:
            note("b")
            note("b", once=True)
            note(None)
            note("")
        note_all(inner)
        note("a", once=True)
    assert outer == ["a", "b"] and inner == ["b"]


def test_a_plan_s_notes_are_its_stages_notes_in_order_and_nothing_leaks_out() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with collecting() as around:
        planned, _ = autoplace.plan(model, (torch.randn(4, 8),), Config(
            devices="2xA100-40GB", dtype="bfloat16", solve=Solve(time_limit_s=1)))
    assert around == []  # the plan's collector is its own
    said = [next(i for i, n in enumerate(planned.notes) if n.startswith(start)) for start in (
        "bfloat16: the model's floating parameters",  # load
        "the what-if row",  # solve
        "cuda:0 not present here",  # emit
    )]
    assert said == sorted(said), planned.notes
