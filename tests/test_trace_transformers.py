"""transformers models as users call them (``use_cache`` on by default) trace and plan, and a
failed trace advises about the cause it has, not about control flow it does not have."""

from __future__ import annotations

import pytest
import torch
import zoo

import autoplace
from autoplace.config import Config, Solve
from autoplace.errors import TraceError
from autoplace.trace import trace_model

transformers = pytest.importorskip("transformers")


def _tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    assert config.use_cache  # the default a new user gets
    return transformers.LlamaForCausalLM(config).eval()


def test_llama_with_default_cache_plans_without_it_and_says_so():
    model = _tiny_llama()
    plan = autoplace.plan(
        model,
        {"input_ids": torch.randint(0, 128, (1, 8))},
        Config(devices="2xA100-40GB", solve=Solve(time_limit_s=2, whatif=False)),
    ).plan
    assert plan.tracer == "export"
    assert plan.verification.status == "passed"
    assert model.config.use_cache is False
    assert any("use_cache=False" in n and "without the key-value cache" in n
               for n in plan.notes)


def test_gpt2_with_default_cache_traces():
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=128, n_embd=32, n_layer=1, n_head=4, n_positions=64)).eval()
    traced = trace_model(model, (), {"input_ids": torch.randint(0, 128, (1, 8))})
    assert traced.tracer == "export"
    assert any("use_cache=False" in n for n in traced.notes)
    # The graph returns the logits only: (1, 8, vocab) float32.
    outputs = [traced.graph.node(o) for o in traced.graph.outputs]
    assert [o.output_shapes for o in outputs] == [((1, 8, 128),)]


def test_an_explicit_use_cache_is_kept_and_the_error_names_the_cache():
    model = _tiny_llama()
    with pytest.raises(TraceError, match=r"holds a DynamicCache .*pass use_cache=False") as info:
        trace_model(model, (), {"input_ids": torch.randint(0, 128, (1, 8)), "use_cache": True})
    assert "control flow" not in str(info.value)
    assert model.config.use_cache is True


class _Box:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class ReturnsBox(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> _Box:
        return _Box(x * 2)


def test_an_unflattenable_output_is_named_without_control_flow_advice():
    with pytest.raises(TraceError, match=r"output holds a _Box .*register_pytree_node") as info:
        trace_model(ReturnsBox(), (torch.randn(2),))
    assert "torch.cond" not in str(info.value)


def test_data_dependent_branches_still_get_control_flow_advice():
    with pytest.raises(TraceError, match=r"torch\.cond or torch\.where"):
        trace_model(zoo.DataDependent().eval(), (torch.randn(2, 4),))
