"""A model's repeated blocks exported once and copied (``trace.repeat``): the graph is the one
torch.export gives the whole model, and where the blocks do not repeat the model is exported
whole."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autoplace.trace as trace
from autoplace.trace import trace_model
from autoplace.trace.repeat import KEPT, REPEAT_OF, repeated_blocks
from autoplace.train import LossModel


def _llama(layers: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, use_cache=False))


def _gpt2(layers: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=32, n_head=2, vocab_size=64,
                                      n_positions=16, use_cache=False, bos_token_id=0,
                                      eos_token_id=0))


def _loss(outputs, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs.logits.reshape(-1, 64), targets.reshape(-1))


def _whole(monkeypatch, model: nn.Module, args: tuple, kwargs: dict | None = None
           ) -> trace.TracedModel:
    """``model`` traced with no blocks found: torch.export of the whole model."""
    with monkeypatch.context() as m:
        m.setattr(trace, "repeated_blocks", lambda model: None)
        return trace_model(model, args, kwargs)


@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_repeated_blocks_trace_to_the_graph_of_the_whole_model(monkeypatch, build,
                                                                device: str) -> None:
    with torch.device(device):
        model = LossModel(build(6), _loss).eval()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    kwargs = {"input_ids": ids, "targets": (ids,)}
    blocks = repeated_blocks(model)
    assert blocks is not None and blocks.count == 6
    assert blocks.path in ("model.model.layers", "model.transformer.h")
    copied = trace_model(model, (), kwargs)
    whole = _whole(monkeypatch, model, (), kwargs)
    assert any("blocks exported as their first 3, the last copied for the other 3" in n
               for n in copied.notes)
    # node for node and name for name, each op's module path, FLOPs, bytes and edges (the
    # copies' counts taken from the ops they copy, not counted)
    last = blocks.path + ".5"
    layer = [n for n in copied.module.graph.nodes if n.op == "call_function" and any(
        v[0].startswith(last) for v in n.meta["nn_module_stack"].values())]
    assert layer and all(n.meta.get(REPEAT_OF) for n in layer)
    assert copied.module.code == whole.module.code
    assert copied.graph == whole.graph
    assert [n.meta.get("nn_module_stack") for n in copied.module.graph.nodes] == [
        n.meta.get("nn_module_stack") for n in whole.module.graph.nodes]
    if device == "cpu":  # the copies read their own blocks' weights
        assert sorted(copied.module.state_dict()) == sorted(whole.module.state_dict())
        torch.testing.assert_close(copied.module(**kwargs), model(**kwargs), rtol=0, atol=0)
        original = model.state_dict(keep_vars=True)
        for name, value in copied.module.state_dict().items():
            assert value is original[name] or torch.equal(value, original[name]), name


class Block(nn.Module):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.scale = scale

    def forward(self, x: torch.Tensor, flip: bool = False,
                before: nn.Module | None = None) -> torch.Tensor:
        y = torch.relu(self.linear(x)) * self.scale
        if before is not None:  # reads the block before's parameter
            y = y + before.linear.bias
        return -y if flip else y


class Stack(nn.Module):
    """Six blocks, run as ``how`` says."""

    def __init__(self, how: str, scales: list[float] | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(s) for s in (scales or [1.0] * 6))
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "index":  # indexes the whole list: cut to three, it fails
            for i in range(6):
                x = self.blocks[i](x)
            return x
        if self.how == "len":  # reads the list's length: cut to three, it would be 3
            for block in self.blocks:
                x = block(x)
            return x / len(self.blocks)
        first = None
        for i, block in enumerate(self.blocks):
            x = block(x, flip=self.how == "flip" and i % 2 == 1  # blocks 1 and 2 differ
                      or self.how == "fourth" and i == 4,  # only a block not traced does
                      before=self.blocks[i - 1] if self.how == "before" and i else None)
            if self.how == "skip":  # each block's output plus the first's: ops between
                first = x if first is None else first
                x = x + first
        return x


@pytest.mark.parametrize(("how", "scales", "found"), [
    ("plain", None, True),  # copied
    ("plain", [1.0, 1.0, 2.0, 1.0, 1.0, 1.0], False),  # block 2's attribute differs
    ("index", None, True),  # found, but the three do not export
    ("flip", None, True),  # found, but blocks 1 and 2 trace to other code
    ("skip", None, True),  # found, but ops run between the blocks
    ("len", None, True),  # found, but the forward reads how many there are
    ("fourth", None, True),  # found, grown, but computes otherwise than the model
    ("before", None, True),  # found, but each block reads the one before's parameter
])
def test_blocks_that_do_not_repeat_are_exported_whole(monkeypatch, how: str,
                                                      scales: list[float] | None,
                                                      found: bool) -> None:
    torch.manual_seed(0)
    model = Stack(how, scales).eval()
    x = torch.randn(4, 8)
    assert (repeated_blocks(model) is not None) is found
    traced = trace_model(model, (x,))
    whole = _whole(monkeypatch, model, (x,))
    copied = any("trace.repeat" in n for n in traced.notes)
    assert copied is (how == "plain" and scales is None)
    assert traced.module.code == whole.module.code
    assert traced.graph == whole.graph
    torch.testing.assert_close(traced.module(x), model(x), rtol=0, atol=0)


def test_a_list_of_shared_or_few_blocks_is_not_repeated() -> None:
    one = Block()
    shared = Stack("plain")
    shared.blocks = nn.ModuleList([one] * 6)  # one module run six times
    assert repeated_blocks(shared) is None
    few = Stack("plain")
    few.blocks = nn.ModuleList(Block() for _ in range(KEPT))
    assert repeated_blocks(few) is None


def test_a_block_reading_another_blocks_parameter_is_exported_whole_on_meta() -> None:
    # On the meta device nothing runs to compare: the graph's own reads must refuse it
    with torch.device("meta"):
        model = Stack("before")
    traced = trace_model(model, (torch.randn(4, 8),))
    assert repeated_blocks(model) is not None
    assert not any("trace.repeat" in n for n in traced.notes)
    assert sum(n.op == "call_function" and "linear" in str(n.target)
               for n in traced.module.graph.nodes) == 6
