"""Generation plans (``--generate N``): the prompt's pass and one token's traced with a static
cache, placed together, the cache counted where it lives, and the emitted model generating the
original's tokens; ``autoplace run --generate``; bad input; the dead-write pass it needs."""

import json
import operator

import pytest
import safetensors.torch
import torch
import torch.fx

import autoplace
from autoplace.cli import main
from autoplace.emit.generate import greedy, load_generator, reference
from autoplace.errors import ConfigError
from autoplace.trace.writes import drop_dead_writes

transformers = pytest.importorskip("transformers")

BATCH, PROMPT, NEW = 2, 12, 5

MODEL_FILE = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM

def build():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32, use_cache=False)
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    return LlamaForCausalLM(config), {"input_ids": ids}
"""


def _llama():
    namespace: dict = {}
    exec(MODEL_FILE, namespace)  # noqa: S102 - the test's own model file
    return namespace["build"]()


def _cache_bytes(model) -> int:
    """Keys and values of every layer, for the prompt and the new tokens, in float32."""
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    return (2 * config.num_hidden_layers * BATCH * config.num_key_value_heads
            * (PROMPT + NEW) * head_dim * 4)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The model over two gloo ranks' devices, each with room for 75% of its weights and
    cache: both hold part of it."""
    from benchmarks.common import capped, weight_bytes

    model, inputs = _llama()
    room = int(0.75 * (weight_bytes(model) + _cache_bytes(model)))
    result = autoplace.plan(model, inputs, autoplace.Config(
        devices=capped("2xcpu-process", room), generate=NEW,
        solve=autoplace.Solve(time_limit_s=3)))
    out = tmp_path_factory.mktemp("generation") / "out"
    autoplace.save(result, out)
    return result, out


def test_plan_counts_the_cache_and_its_generation_equals_the_original(planned):
    result, _ = planned
    gen = result.plan.generation
    assert gen is not None and gen.check == "passed"
    assert (gen.new_tokens, gen.prompt_tokens, gen.batch) == (NEW, PROMPT, BATCH)
    model, _ = _llama()
    assert sum(gen.cache_bytes.values()) == _cache_bytes(model)
    assert gen.measured_cache_bytes == gen.cache_bytes
    assert gen.total_s == pytest.approx(gen.prefill_s + (NEW - 1) * gen.step_s)
    assert 0 < gen.step_s < gen.prefill_s
    # never slower than a baseline, each scored as generation runs
    assert all(gen.total_s <= total * (1 + 1e-9) for total in gen.baselines.values())
    assert "generation" in result.plan.to_dict()


def test_saved_generator_generates_the_original_tokens(planned):
    _, out = planned
    prefill, decode = load_generator(out / "model")
    model, inputs = _llama()
    model.eval()
    got = greedy(prefill, decode, inputs["input_ids"], new_tokens=NEW)
    assert torch.equal(got, reference(model, inputs["input_ids"], new_tokens=NEW))
    plan = autoplace.Plan.load(out)
    assert plan.generation.cache_bytes == planned[0].plan.generation.cache_bytes


def test_run_generate_prints_time_per_token_and_saves_the_tokens(planned, tmp_path, capsys):
    _, out = planned
    target = tmp_path / "tokens.safetensors"
    assert main(["run", str(out), "--generate", str(NEW), "--json", "--warmup", "0",
                 "--save-outputs", str(target)]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["new_tokens"] == NEW and said["ms_per_token"] > 0
    assert said["predicted_ms_per_token"] == pytest.approx(
        planned[0].plan.generation.step_s * 1e3)
    model, inputs = _llama()
    model.eval()
    sequences = safetensors.torch.load_file(target)["sequences"]
    assert torch.equal(sequences, reference(model, inputs["input_ids"], new_tokens=NEW))


def test_two_ranks_generate_the_original_tokens(planned, tmp_path, capsys):
    result, out = planned
    assert len(set(result.plan.schedule.placement.device_of.values())) == 2
    assert (out / "launch.py").is_file()
    target = tmp_path / "tokens.safetensors"
    assert main(["run", str(out), "--generate", str(NEW), "--nproc", "2", "--json",
                 "--save-outputs", str(target)]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["ranks"] == 2 and len(said["steps_ms"]) == NEW - 1
    model, inputs = _llama()
    model.eval()
    sequences = safetensors.torch.load_file(target)["sequences"]
    assert torch.equal(sequences, reference(model, inputs["input_ids"], new_tokens=NEW))


def test_run_generate_refuses_more_tokens_than_the_cache_holds(planned, capsys):
    _, out = planned
    assert main(["run", str(out), "--generate", str(NEW + 1)]) == 2
    assert f"holds {NEW} new tokens" in capsys.readouterr().err


@pytest.mark.parametrize("value", [0, -3])
def test_generate_must_be_positive(value):
    with pytest.raises(ConfigError, match="generate"):
        autoplace.Config(generate=value)


def test_cli_refuses_a_model_that_is_not_a_causal_lm(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["plan", "examples/mlp.py", "--devices", "2xcpu-thread", "--generate", "4",
                 "--out", str(out)]) == 2
    assert "not a causal language model" in capsys.readouterr().err
    assert not out.exists()


def test_prompt_and_new_tokens_beyond_the_positions_is_refused():
    model, inputs = _llama()
    with pytest.raises(ConfigError, match=r"beyond the model's 32: generate at most 20"):
        autoplace.plan(model, inputs, autoplace.Config(devices="2xcpu-thread", generate=21))


def _graph(build) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    build(graph, x)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_a_write_nothing_reads_after_is_dropped_and_one_read_later_is_kept():
    add, add_ = torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor

    def dead(graph, x):
        y = graph.call_function(torch.ops.aten.clone.default, (x,))
        out = graph.call_function(add, (y, 1))
        graph.call_function(add_, (y, 5))  # counts, then nothing reads it
        graph.output(out)

    def live(graph, x):
        y = graph.call_function(torch.ops.aten.clone.default, (x,))
        graph.call_function(add_, (y, 5))
        view = graph.call_function(torch.ops.aten.view.default, (y, [-1]))
        graph.output(graph.call_function(operator.add, (view, 1)))

    def of_input(graph, x):
        graph.call_function(add_, (x, 5))
        graph.output(x)

    gm = _graph(dead)
    assert len(drop_dead_writes(gm)) == 1
    torch.testing.assert_close(gm(torch.zeros(3)), torch.ones(3))
    for build in (live, of_input):
        assert drop_dead_writes(_graph(build)) == []


def test_a_device_map_plan_counts_each_layers_cache_where_the_layer_goes():
    from benchmarks.common import capped, weight_bytes

    model, inputs = _llama()
    weights = weight_bytes(model) + sum(b.numel() * b.element_size() for b in model.buffers())
    room = int(0.6 * (weights + _cache_bytes(model)))
    planned = autoplace.plan(model, inputs, autoplace.Config(
        devices=capped("2xA100-40GB", room), granularity="module", generate=NEW))
    plan = planned.plan
    assert sum(n.param_bytes for n in plan.problem.graph.nodes) == weights + _cache_bytes(model)
    said = [n for n in plan.notes if n.startswith(f"--generate {NEW}: the key-value cache")]
    assert len(said) == 1 and "cuda:0" in said[0] and "cuda:1" in said[0]
    assert not any("generation reusing a cache is not planned" in n for n in plan.notes)


def test_accelerate_maps_made_from_the_weights_alone_overflow_with_the_cache():
    pytest.importorskip("accelerate")
    from benchmarks.common import capped, weight_bytes

    model, inputs = _llama()
    # Room for the weights on one device, not for the weights and the cache.
    room = weight_bytes(model) + _cache_bytes(model) // 2
    planned = autoplace.plan(model, inputs, autoplace.Config(
        devices=capped("2xA100-40GB", room), granularity="module", generate=NEW))
    said = [n for n in planned.plan.notes if "with the cache counted" in n]
    assert any("over by" in n and "before any activation" in n for n in said), said
    devices = planned.plan.schedule.placement.device_of
    resident = {}
    for node in planned.plan.problem.graph.nodes:
        resident[devices[node.name]] = resident.get(devices[node.name], 0) + node.param_bytes
    assert all(size <= room for size in resident.values())  # the plan's own map fits


def test_a_throughput_plan_scores_placements_by_the_busiest_devices_decode_load():
    from autoplace.pipeline.generation import _Passes

    model, inputs = _llama()
    result = autoplace.plan(model, inputs, autoplace.Config(
        devices="2xcpu-thread", generate=NEW,
        solve=autoplace.Solve(objective="throughput", time_limit_s=2)))
    plan = result.plan
    assert plan.objective == "throughput" and plan.generation.check == "passed"
    passes = _Passes(prefill=plan.problem, decode=plan.problem, new_tokens=NEW)
    load = passes.score(plan.schedule.placement, "throughput")
    assert load == pytest.approx(plan.schedule.objective_s("throughput"))


def test_a_model_built_empty_generates_from_its_checkpoint(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    model, inputs = _llama()
    model.save_pretrained(tmp_path / "saved")
    with accelerate.init_empty_weights():
        empty, _ = _llama()
    result = autoplace.plan(empty, inputs, autoplace.Config(
        devices="2xcpu-thread", generate=NEW, checkpoint=tmp_path / "saved",
        solve=autoplace.Solve(time_limit_s=2)))
    assert result.plan.generation.check == "passed"
    autoplace.save(result, tmp_path / "out")
    prefill, decode = load_generator(tmp_path / "out" / "model")
    model.eval()
    assert torch.equal(greedy(prefill, decode, inputs["input_ids"], new_tokens=NEW),
                       reference(model, inputs["input_ids"], new_tokens=NEW))


def test_a_sliding_window_model_generates_within_its_window_and_is_refused_beyond():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(
        vocab_size=200, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=16,
        max_position_embeddings=64))
    prompt = {"input_ids": torch.randint(0, 200, (1, 12))}
    with pytest.raises(ConfigError, match="sliding window of 16, which the static cache keeps "
                       "whole: generate at most 4 tokens"):
        autoplace.plan(model, prompt, autoplace.Config(devices="2xcpu-thread", generate=8))
    planned = autoplace.plan(model, prompt, autoplace.Config(
        devices="2xcpu-thread", generate=4, solve=autoplace.Solve(time_limit_s=1)))
    assert planned.plan.generation.check == "passed"
