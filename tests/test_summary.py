"""The terminal summary as a newcomer reads it: one sentence first that says what to do and why,
the time limit as it was given and how it was shared, and tables that fit 80 columns.

The diamond graph (examples/graphs/diamond.json): embed (pinned to gpu0), then left and right
(10 ms each on an A100), post and head. On gpu0 alone: 2 + 10 + 10 + 1 + 3 = 26 ms; with left
and right on two GPUs at once, about 20 ms with the copies: a split gains about 30%.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from autoplace.config import Config, Emit, Solve
from autoplace.formats.graph import load_graph_file
from autoplace.pipeline import plan, solve_graph
from autoplace.report import render_markdown, summary_text

ROOT = Path(__file__).resolve().parents[1]
DIAMOND = ROOT / "examples" / "graphs" / "diamond.json"


def _diamond(min_gain: float):
    return solve_graph(load_graph_file(DIAMOND),
                       Solve(time_limit_s=2, deterministic=True, min_gain=min_gain))


def test_a_split_under_min_gain_says_use_one_device_and_why():
    planned = _diamond(0.9)
    first = summary_text(planned, width=80).splitlines()[0]
    gain = planned.min_gain.split_gain
    assert planned.min_gain.single_device_chosen and 0.1 < gain < 0.9
    assert first == (f"Use one device (gpu0): a split over 2 gains {gain:.1%}, under "
                     "--min-gain 90%."), first
    assert f"**{first}**" in render_markdown(planned)


def test_a_split_says_how_much_faster_and_how_far_from_the_bound():
    planned = _diamond(0.0)
    first = summary_text(planned, width=200).splitlines()[0]
    assert len(set(planned.schedule.placement.device_of.values())) == 2
    assert first == (f"Split over 2 devices (gpu0, gpu1): {planned.speedup_over_single:.2f}x "
                     f"faster than gpu0 alone, {planned.gap:.1%} from the lower bound; 1 of "
                     "the 3 devices unused."), first


def test_the_solver_line_gives_the_limit_as_given_and_how_it_was_shared():
    # 2 s given: the what-if row (the first device) runs first, the plan's solve has the rest.
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    planned = plan(
        model,
        (torch.randn(4, 8),),
        Config(
            devices="2xA100-40GB",
            solve=Solve(time_limit_s=2.0, deterministic=True),
            emit=Emit(model=False),
        ),
    ).plan
    solver = planned.solver
    assert solver.budget_s == 2.0 and solver.whatif_s is not None
    assert solver.time_limit_s == pytest.approx(2.0 - solver.whatif_s)
    text = summary_text(planned, width=200)
    line = next(line for line in text.splitlines() if line.startswith("solver"))
    assert re.search(r"\(limit 2 s: .+ to the what-if rows, .+ to this solve\)$", line), line
    assert "the default" not in line


def test_every_table_fits_80_columns_for_a_training_plan():
    # The training step's memory table has seven columns: its headers were cut at 80 columns
    # ("dev...", "paramet...").
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    planned = plan(
        model,
        (torch.randn(4, 8),),
        Config(
            devices="2xA100-40GB",
            mode="training",
            solve=Solve(time_limit_s=1.0, deterministic=True),
            emit=Emit(model=False),
        ),
        loss=torch.nn.functional.cross_entropy,
        example_targets=(torch.tensor([0, 1, 0, 1]),),
    ).plan
    text = summary_text(planned, width=80)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    for header in ("device", "parameters", "gradients", "optimizer", "activations", "reserve",
                   "peak"):
        assert re.search(rf"\b{header}\b", text), header
    assert text.splitlines()[0].startswith("Use one GPU (cuda:0): ")
