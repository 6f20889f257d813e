"""--granularity module: Hugging Face device_maps for GPT-2, Llama, T5, BERT and Mixtral.

Each model is a tiny transformers config with random weights (nothing downloaded). Planned on two
GPUs capped so the weights must be split, the map must cover every ``state_dict`` entry
(accelerate's own ``check_device_map``), keep tied weights and no-split modules on one device, be
accepted by ``accelerate.dispatch_model``, and, with every device remapped to the CPU, load with
``from_pretrained`` into a model whose outputs equal the original's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from accelerate import dispatch_model
from accelerate.utils import check_device_map, find_tied_parameters

from autoplace.cli import main
from autoplace.cluster import resolve_cluster
from autoplace.config import Config, Solve
from autoplace.emit.files.hf_device_map import remapped, uncovered
from autoplace.errors import InfeasibleError
from autoplace.formats.plan import read_plan
from autoplace.pipeline import plan, save
from autoplace.report import render_html, render_markdown, summary_text
from autoplace.trace.modules import trace_modules


def _gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96,
                                     n_positions=32, tie_word_embeddings=True, use_cache=False)
    return transformers.GPT2LMHeadModel(config), {"input_ids": torch.randint(0, 96, (2, 12))}


def _llama():
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=96, use_cache=False)
    return transformers.LlamaForCausalLM(config), {"input_ids": torch.randint(0, 96, (2, 12))}


def _t5():
    config = transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                   num_heads=4, use_cache=False)
    return transformers.T5ForConditionalGeneration(config), {
        "input_ids": torch.randint(0, 96, (2, 12)),
        "decoder_input_ids": torch.randint(0, 96, (2, 6))}


def _bert():
    config = transformers.BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64)
    return transformers.BertForMaskedLM(config), {"input_ids": torch.randint(0, 96, (2, 12))}


def _mixtral():
    config = transformers.MixtralConfig(hidden_size=32, intermediate_size=16,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, vocab_size=96, use_cache=False)
    return transformers.MixtralForCausalLM(config), {"input_ids": torch.randint(0, 96, (2, 12))}


MODELS = {"gpt2": _gpt2, "llama": _llama, "t5": _t5, "bert": _bert, "mixtral": _mixtral}


def _build(name: str):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    return model.eval(), inputs


def _capped(share: float, weights: int, spec: str = "2xA100-40GB"):
    cluster, _ = resolve_cluster(spec=spec)
    cap = int(share * weights)
    return dataclasses.replace(cluster, devices=tuple(
        dataclasses.replace(d, memory_bytes=cap, reserved_bytes=0) for d in cluster.devices))


def _modules(model: torch.nn.Module, inputs: dict, devices, *, time_limit_s: float = 1.0,
             deterministic: bool = True):
    """``model`` planned module by module on ``devices``: the plan (``--granularity module``)."""
    config = Config(devices=devices, granularity="module",
                    solve=Solve(time_limit_s=time_limit_s, deterministic=deterministic))
    return plan(model, inputs, config).plan


def _split_cluster(model: torch.nn.Module, inputs: dict, share: float = 0.7):
    """Two GPUs each capped at ``share`` of what the model needs on one device (weights, the
    largest workspace, every module's outputs): at 70% the plan must use both."""
    graph = trace_modules(model, (), inputs).graph
    need = _weights(model) + max(n.workspace_bytes for n in graph.nodes) + sum(
        n.output_bytes for n in graph.nodes)
    return _capped(share, need)


def _weights(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _device_of(mapping: dict, tensor_name: str):
    """The device ``mapping`` gives ``tensor_name``: its longest covering key's."""
    parts = tensor_name.split(".")
    for i in range(len(parts), -1, -1):
        key = ".".join(parts[:i])
        if key in mapping:
            return mapping[key]
    raise AssertionError(f"{tensor_name} is not covered")


@pytest.mark.parametrize("name", list(MODELS))
def test_device_map_loads_and_matches_the_original(name: str, tmp_path: Path) -> None:
    model, inputs = _build(name)
    with torch.no_grad():
        expected = model(**inputs)
    planned = _modules(model, inputs, _split_cluster(model, inputs))
    mapping = planned.device_map.map
    assert set(mapping.values()) == {0, 1}, mapping
    check_device_map(model, mapping)  # raises if any parameter or buffer is left out
    assert uncovered(model, mapping) == []
    for group in find_tied_parameters(model):  # tied weights share a device
        assert len({_device_of(mapping, p) for p in group}) == 1, group
    no_split = set(model._no_split_modules)
    for module_name, module in model.named_modules():
        if type(module).__name__ in no_split:  # each kept whole
            tensors = [f"{module_name}.{t}" for t, _ in module.state_dict().items()]
            assert len({_device_of(mapping, t) for t in tensors}) == 1, module_name
    # the simulator's peaks, activations included, fit the caps; accelerate's maps are scored
    assert planned.schedule.feasible
    for strategy in ("accelerate-sequential", "accelerate-balanced"):
        baseline = planned.baselines.get(strategy)
        if baseline is not None and baseline.feasible:
            assert planned.makespan_s <= baseline.makespan_s * (1 + 1e-9)

    save(planned, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "device_map.json").read_text())
    assert written == mapping
    assert read_plan(tmp_path / "out" / "plan.json").device_map.map == mapping

    model.save_pretrained(tmp_path / "saved")
    loaded = type(model).from_pretrained(tmp_path / "saved", device_map=remapped(written))
    with torch.no_grad():
        got = loaded.eval()(**inputs)
    torch.testing.assert_close(got.logits, expected.logits)
    dispatched = dispatch_model(_build(name)[0], device_map=remapped(written))
    with torch.no_grad():
        torch.testing.assert_close(dispatched(**inputs).logits, expected.logits)


def test_a_module_plan_says_it_covers_a_pass_without_the_cache() -> None:
    # As the op-level plan does (and docs/cli.md promises): with use_cache on, the model is
    # planned with it off, and a note says the plan covers one pass without the cache.
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96,
                                     n_positions=32, use_cache=True)
    model = transformers.GPT2LMHeadModel(config).eval()
    planned = _modules(model, {"input_ids": torch.randint(0, 96, (2, 12))}, "2xA100-40GB",
                       time_limit_s=0.5)
    assert model.config.use_cache is False
    assert any("without the key-value cache" in note for note in planned.notes), planned.notes


def test_units_tie_and_cover_gpt2() -> None:
    # GPT-2's lm_head shares its weight with transformer.wte: the two units are colocated, and
    # the weight counts once (in wte), so the graph's bytes are the model's.
    model, inputs = _build("gpt2")
    traced = trace_modules(model, (), inputs)
    graph = traced.graph
    assert ("lm_head", "transformer.wte") in graph.colocate
    assert graph.node("lm_head").param_bytes == 0
    assert graph.total_param_bytes == _weights(model) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    # one node per block, in call order, each fed by the one before
    blocks = [n.name for n in graph.nodes if n.name.startswith("transformer.h.")]
    assert blocks == ["transformer.h.0", "transformer.h.1"]
    assert any(e.src == "transformer.h.0" and e.dst == "transformer.h.1" for e in graph.edges)
    # a block's FLOPs: at least its matmuls, 2 * tokens * (4 + 8) * width^2
    assert graph.node("transformer.h.0").flops >= 2 * 24 * 12 * 32 * 32
    assert graph.outputs == ("lm_head",)


def test_t5_shared_embedding_covers_every_alias() -> None:
    # T5's encoder.embed_tokens and decoder.embed_tokens are the module `shared` under two more
    # names: the map names all three, and the one unit runs twice (encoder, then decoder).
    model, inputs = _build("t5")
    planned = _modules(model, inputs, _split_cluster(model, inputs))
    mapping = planned.device_map.map
    assert mapping["shared"] == mapping["encoder.embed_tokens"] == mapping[
        "decoder.embed_tokens"]


def test_no_split_module_too_big_is_a_clear_error(tmp_path: Path, capsys) -> None:
    # Llama's decoder layers are kept whole; each holds q and o (32 x 32), k and v (32 x 16: two
    # key-value heads of 8), gate, up and down (32 x 64) and two norms (32): 9,280 float32
    # values, 37,120 bytes. Devices of 30,000 bytes cannot hold one.
    model, inputs = _build("llama")
    with pytest.raises(InfeasibleError,
                       match=r"'model.layers.0' needs 37,120 bytes .*LlamaDecoderLayer"):
        _modules(model, inputs, _capped(1.0, 30_000), deterministic=False)
    # The command line: a Llama whose one decoder layer (width 16,384, MLP 65,536: 4 * 16,384^2
    # + 3 * 16,384 * 65,536 + 2 * 16,384 float32 values, 17,180,000,256 bytes) outgrows a
    # T4-16GB, built on the meta device (no memory) and run there.
    model_file = tmp_path / "big_layer.py"
    model_file.write_text(textwrap.dedent("""\
        import torch, transformers
        def build():
            config = transformers.LlamaConfig(hidden_size=16384, intermediate_size=65536,
                num_hidden_layers=1, num_attention_heads=128, num_key_value_heads=128,
                vocab_size=96, use_cache=False)
            with torch.device("meta"):
                model = transformers.LlamaForCausalLM(config)
            return model, {"input_ids": torch.randint(0, 96, (1, 8))}
        """))
    out = tmp_path / "out"
    code = main(["plan", str(model_file), "--granularity", "module", "--devices", "T4-16GB",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "'model.layers.0'" in err and "17,180,000,256 bytes" in err, err
    assert "LlamaDecoderLayer" in err and "--no-split" in err
    assert not out.exists()


def test_report_shows_where_accelerates_map_overflows(tmp_path: Path) -> None:
    # At 80% of what tiny Llama needs on one device, accelerate's sequential map fills GPU 0
    # by weights and overflows it once activations count; the plan fits. The report, read
    # back from plan.json, says which device and by how much.
    model, inputs = _build("llama")
    planned = _modules(model, inputs, _split_cluster(model, inputs, 0.8))
    save(planned, tmp_path / "out")
    again = read_plan(tmp_path / "out" / "plan.json")
    sequential = again.baselines["accelerate-sequential"]
    assert planned.schedule.feasible and not sequential.feasible
    capacity = {d.name: d.memory_bytes for d in again.problem.cluster.devices}
    over = {d: b - capacity[d] for d, b in sequential.peak_bytes.items() if b > capacity[d]}
    assert over
    from autoplace.report.units import format_bytes

    phrase = ", ".join(f"{d} by {format_bytes(b)}" for d, b in over.items())
    assert "| accelerate-sequential | " in render_markdown(again)
    assert f"**overflows** {phrase}" in render_markdown(again)
    assert f"overflows {phrase}" in render_html(again)
    assert f"OVERFLOWS {phrase}" in summary_text(again, width=160)
    # the module rows, runs of modules placed alike merged: the first row starts at the first
    assert "\n| model.embed_tokens" in render_markdown(again)


TINY_GPT2 = """\
import torch, transformers
def build():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96,
                                     n_positions=32, use_cache=False)
    return transformers.GPT2LMHeadModel(config), {"input_ids": torch.randint(0, 96, (2, 12))}
"""


def test_cli_writes_the_device_map_and_takes_no_split(tmp_path: Path, capsys) -> None:
    model_file = tmp_path / "tiny_gpt2.py"
    model_file.write_text(TINY_GPT2)
    out = tmp_path / "out"
    # --no-split GPT2MLP replaces the model's GPT2Block: blocks are split into their parts,
    # each MLP kept whole.
    assert main(["plan", str(model_file), "--granularity", "module", "--devices",
                 "2xT4-16GB", "--no-split", "GPT2MLP", "--out", str(out)]) == 0
    mapping = json.loads((out / "device_map.json").read_text())
    assert "transformer.h.0.mlp" in mapping and "transformer.h.0" not in mapping
    assert "transformer.h.0.attn.c_attn" in mapping
    assert read_plan(out / "plan.json").device_map.no_split == ("GPT2MLP",)
    assert "device_map.json" in capsys.readouterr().out
    # a class the model does not use is refused, naming the classes it does use
    assert main(["plan", str(model_file), "--granularity", "module", "--no-split", "GPT2Blok",
                 "--out", str(tmp_path / "typo")]) == 2
    err = capsys.readouterr().err
    assert "GPT2Blok" in err and "GPT2Block" in err and not (tmp_path / "typo").exists()
    # `autoplace run` has no emitted model to run, and says where the artefact is
    assert main(["run", str(out)]) == 2
    assert "device_map.json" in capsys.readouterr().err
    # --no-split belongs to --granularity module; the default granularity refuses it
    assert main(["plan", str(model_file), "--no-split", "GPT2MLP", "--out",
                 str(tmp_path / "other")]) == 2
    assert "--granularity module" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
    # --checkpoint is for the emitted model; a device_map is loaded with it by from_pretrained
    assert main(["plan", str(model_file), "--granularity", "module", "--checkpoint",
                 str(tmp_path), "--out", str(tmp_path / "ckpt")]) == 2
    assert "from_pretrained" in capsys.readouterr().err and not (tmp_path / "ckpt").exists()


def test_pin_map_at_module_granularity_fixes_those_modules(tmp_path: Path, capsys) -> None:
    # A partial device_map in: the embedding on GPU 1 (its tied lm_head follows), the first
    # block on GPU 0, and a submodule of the second (kept whole, GPT2Block) on GPU 1, which
    # pins that block whole. The rest is solved; device_map.json honours every pin.
    model_file = tmp_path / "tiny_gpt2.py"
    model_file.write_text(TINY_GPT2)
    pin_map = tmp_path / "pins.json"
    pin_map.write_text(json.dumps({"transformer.wte": 1, "transformer.h.0": 0}))
    out = tmp_path / "out"
    assert main(["plan", str(model_file), "--granularity", "module", "--devices", "2xT4-16GB",
                 "--pin-map", str(pin_map), "--pin", "transformer.h.1.mlp=cuda:1",
                 "--deterministic", "--out", str(out)]) == 0
    mapping = json.loads((out / "device_map.json").read_text())
    assert mapping["transformer.wte"] == 1 and mapping["lm_head"] == 1
    assert mapping["transformer.h.0"] == 0 and mapping["transformer.h.1"] == 1
    assert {"transformer.wpe", "transformer.ln_f"} <= set(mapping)
    plan = read_plan(out / "plan.json")
    assert plan.pins.modules == {"transformer.wte": "cuda:1", "transformer.h.0": "cuda:0",
                                    "transformer.h.1.mlp": "cuda:1"}
    assert plan.pins.ops == 4  # wte, lm_head (tied), h.0, h.1
    # What the pins cost, against the module plan solved without them: the pinned plan
    # crosses devices twice where the unpinned one needs no copy at all.
    assert plan.pins_cost_s == pytest.approx(plan.objective_s - plan.pins.unpinned_objective_s)
    assert plan.pins_cost_s > 0
    data = json.loads((out / "plan.json").read_text())
    assert data["pins"]["cost_s"] == pytest.approx(plan.pins_cost_s)
    assert "pins cost" in capsys.readouterr().out
    assert "against the unpinned plan" in (out / "summary.txt").read_text()


@pytest.mark.parametrize(("pins", "pattern"), [
    (["transformer.h.0.attn=0", "transformer.h.0.mlp=1"],
     r"pins split module 'transformer.h.0', which the device_map keeps whole.*"
     r"'transformer.h.0.(attn|mlp)' on cuda:\d and 'transformer.h.0.(attn|mlp)' on cuda:\d"),
    (["transformer=0", "transformer.h.1.ln_1=1"],
     r"pins split module 'transformer.h.1'.*'transformer.h.1.ln_1' on cuda:1 and "
     r"'transformer' on cuda:0"),
    (["transformer.h.9=0"], r"pin of unknown module 'transformer.h.9': did you mean"),
])
def test_bad_module_pins_exit_2_naming_them(tmp_path: Path, capsys, pins, pattern) -> None:
    model_file = tmp_path / "tiny_gpt2.py"
    model_file.write_text(TINY_GPT2)
    argv = [arg for pin in pins for arg in ("--pin", pin)]
    assert main(["plan", str(model_file), "--granularity", "module", "--devices", "2xT4-16GB",
                 *argv, "--out", str(tmp_path / "out")]) == 2
    assert re.search(pattern, capsys.readouterr().err.replace("\n", " "))
    assert not (tmp_path / "out").exists()


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, shared: torch.nn.Module) -> torch.Tensor:
        return self.linear(x) + shared(x) * 2


class _Shared(torch.nn.Module):
    # `shared` (a unit: no children) runs twice, once from inside `layer` (a no-split unit).
    # FLOPs on 4 rows of 8: a Linear(8, 8) is 2 * 4 * 8 * 8 = 512 (its bias add is part of
    # addmm's count); the layer's add and mul are elementwise, which the formulas count as 0.
    _no_split_modules = ["_Layer"]

    def __init__(self) -> None:
        super().__init__()
        self.shared = torch.nn.Linear(8, 8)
        self.layer = _Layer()
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.shared(x), self.shared))


def test_a_unit_called_inside_another_counts_its_own_ops() -> None:
    graph = trace_modules(_Shared(), (torch.randn(4, 8),), {}).graph
    assert graph.node("shared").flops == 2 * 512
    assert graph.node("layer").flops == 512
    # the layer's own ops: its linear's (t, addmm), then, after the nested call, add and mul
    assert graph.node("layer").launches == 4
    assert graph.node("shared").launches == 2 * 2
    assert [(e.src, e.dst) for e in graph.edges] == [
        ("input", "shared"), ("shared", "layer"), ("layer", "head")]
