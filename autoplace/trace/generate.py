"""Trace text generation (``--generate N``): a causal language model with a static key-value
cache, as two graphs of one program, the prompt's pass (prefill) and one new token's (decode).

``CachedLM`` holds transformers' ``StaticCache`` sized for the prompt and the new tokens, its
keys and values registered as buffers (as transformers' own ``TorchExportableModuleWithStaticCache``
does for ExecuTorch), so torch.export traces the cache writes as in-place ops on them: each
layer's cache is a buffer its attention reads, placed and counted with that layer.
Traced on the prompt and on one token (``generation_inputs``), both graphs hold the same ops
under the same names (only their shapes differ; ``check_same_ops``), so one placement places
both. ``prompt_of`` checks what generation needs (a causal LM, ``input_ids``, room for the new
tokens) and says what is wrong with exit code 2.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from autoplace.errors import ConfigError, TraceError
from autoplace.trace import SHAPE_ONLY_OPS, TracedModel
from autoplace.trace.count import op_name

__all__ = ["CACHE_BUFFER_PREFIXES", "CachedLM", "check_same_ops", "generation_inputs",
           "layer_cache_bytes", "max_positions", "prompt_of", "static_cache"]

# The names of the cache's buffers in ``CachedLM``, one of each per layer.
CACHE_BUFFER_PREFIXES = ("key_cache_", "value_cache_")


class CachedLM(torch.nn.Module):
    """``model`` (a transformers causal LM) with a static cache for ``batch`` sequences of up to
    ``max_len`` tokens: ``forward(input_ids, cache_position)`` writes the tokens' keys and
    values at ``cache_position`` and returns their logits. The prompt is one call at positions
    ``0..L-1``; each new token one call at its position. Sliding-window layers are kept whole
    (``prompt_of`` checks that ``max_len`` is within the window)."""

    keeps_cache = True  # ``trace.cache_off`` leaves the inner model's cache on

    def __init__(self, model: torch.nn.Module, *, batch: int, max_len: int) -> None:
        super().__init__()
        self.model = model
        weight = next(model.parameters())
        self.cache = cache = static_cache(model, batch=batch, max_len=max_len,
                                          device=weight.device)
        for i, layer in enumerate(cache.layers):
            self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
            self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
        parameters = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"
        self._positions = "cache_position" in parameters  # transformers 4 takes them

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.cache.layers):
            # The cache reads its tensors through this module's buffers, which torch.export
            # swaps for its own while tracing (else they would be constants of the graph).
            layer.keys = getattr(self, f"key_cache_{i}")
            layer.values = getattr(self, f"value_cache_{i}")
            # Where the tokens go, from the input: a buffer written in place here would be read
            # by ops with no edge from the write, which the emitted segments may run before it
            # (the cache's own writes are read through their result, so they are ordered).
            layer.cumulative_length = cache_position[0].clone()
        extra = {"cache_position": cache_position} if self._positions else {}
        out = self.model(input_ids=input_ids, use_cache=True,
                         **{self._cache_arg: self.cache}, **extra)
        for layer in self.cache.layers:  # no tracer's tensor outlives its trace
            layer.keys = layer.values = layer.cumulative_length = None
        return out.logits


def static_cache(model: torch.nn.Module, *, batch: int, max_len: int,
                 device: torch.device | str) -> Any:
    """transformers' ``StaticCache`` of ``model`` for ``batch`` sequences of ``max_len`` tokens,
    its tensors allocated on ``device`` (``"meta"``: sized, nothing allocated), in the model's
    dtype; sliding-window layers kept whole."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer
    from transformers.integrations.executorch import get_head_shapes

    if not hasattr(StaticCache, "early_initialization"):
        import transformers

        raise ConfigError(f"{{generate}} needs transformers' StaticCache of layers made up "
                          f"front (early_initialization), which transformers "
                          f"{transformers.__version__} lacks: upgrade transformers")
    config = model.config.get_text_config()
    cache = StaticCache(max_cache_len=max_len, config=config)
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, StaticSlidingWindowLayer):
            cache.layers[i] = StaticLayer(max_len)
    heads, head_dim = get_head_shapes(config)
    dtype = next(model.parameters()).dtype
    cache.early_initialization(batch, heads, head_dim, dtype, device)
    return cache


def layer_cache_bytes(model: torch.nn.Module, *, batch: int, max_len: int) -> dict[str, int]:
    """Each cache layer's keys and values in bytes, by the path of the module that writes them
    (the first whose ``layer_idx`` is that layer's, transformers' attention modules): where
    the cache lives when the model generates with a ``device_map``."""
    cache = static_cache(model, batch=batch, max_len=max_len, device="meta")
    writer: dict[int, str] = {}
    for path, module in model.named_modules():
        index = getattr(module, "layer_idx", None)
        if isinstance(index, int) and index not in writer:
            writer[index] = path
    missing = [i for i in range(len(cache.layers)) if i not in writer]
    if missing:
        raise ConfigError(f"{{generate}}: no module of {type(model).__name__} says it holds "
                          f"cache layer {missing[0]} (transformers' layer_idx): its cache "
                          "cannot be placed; plan it at op granularity")
    return {writer[i]: sum(t.numel() * t.element_size() for t in (layer.keys, layer.values))
            for i, layer in enumerate(cache.layers)}


def max_positions(model: torch.nn.Module) -> int | None:
    """The longest sequence ``model``'s configuration allows, or ``None`` where it says none."""
    config = model.config.get_text_config()
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def prompt_of(model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any], *,
              new_tokens: int) -> torch.Tensor:
    """The prompt (``input_ids``, batch x tokens) ``model`` generates ``new_tokens`` after, from
    its example inputs; a ``ConfigError`` naming what generation needs where it is missing."""
    config = getattr(model, "config", None)
    if (config is None or not hasattr(config, "get_text_config")
            or not callable(getattr(model, "generate", None))
            or getattr(config, "is_encoder_decoder", False)):
        raise ConfigError(
            f"{{generate}}: {type(model).__name__} is not a causal language model; --generate "
            "needs a transformers model that generates text from a prompt alone (a "
            "...ForCausalLM or ...LMHeadModel with a generate method), not an encoder-decoder "
            "or another module: plan it without --generate")
    ids = kwargs.get("input_ids", args[0] if args else None)
    extra = sorted(set(kwargs) - {"input_ids", "attention_mask", "use_cache"})
    mask = kwargs.get("attention_mask")
    if (not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long
            or len(args) > 1 or extra):
        raise ConfigError(
            "{generate}: the example inputs are the prompt, so they must be input_ids alone "
            f"(a batch x tokens tensor of token ids; got {_described(ids)}"
            f"{', and ' + ', '.join(extra) if extra else ''}): return {{'input_ids': ids}} "
            "from build()")
    if mask is not None and not bool(torch.all(mask == 1)):
        raise ConfigError("{generate}: the prompt's attention_mask pads some sequences; "
                          "generation plans take prompts of equal length: drop the padding")
    window = getattr(config.get_text_config(), "sliding_window", None)
    if isinstance(window, int) and window > 0 and ids.shape[1] + new_tokens > window:
        raise ConfigError(
            f"{{generate}} {new_tokens}: a prompt of {ids.shape[1]} tokens and {new_tokens} new "
            f"ones make {ids.shape[1] + new_tokens} positions, beyond the model's sliding "
            f"window of {window}, which the static cache keeps whole: generate at most "
            f"{window - ids.shape[1]} tokens")
    limit = max_positions(model)
    if limit is not None and ids.shape[1] + new_tokens > limit:
        raise ConfigError(
            f"{{generate}} {new_tokens}: a prompt of {ids.shape[1]} tokens and {new_tokens} new "
            f"ones make {ids.shape[1] + new_tokens} positions, beyond the model's "
            f"{limit}: generate at most {limit - ids.shape[1]} tokens")
    return ids


def _described(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dim()}-d {str(value.dtype).removeprefix('torch.')} tensor"
    return type(value).__name__


def generation_inputs(prompt: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor],
                                                     tuple[torch.Tensor, torch.Tensor]]:
    """The prefill's inputs (the prompt at positions ``0..L-1``) and a decode step's (one token
    per sequence at position ``L``)."""
    length = prompt.shape[1]
    positions = torch.arange(length, device=prompt.device)
    return ((prompt, positions),
            (prompt[:, -1:].clone(), torch.tensor([length], device=prompt.device)))


def _skeleton(traced: TracedModel) -> list[tuple[str, str]]:
    """The ops of ``traced`` that launch work, by name and target."""
    return [(n.name, str(n.target)) for n in traced.module.graph.nodes
            if n.op != "call_function" or op_name(n.target) not in SHAPE_ONLY_OPS]


def check_same_ops(prefill: TracedModel, decode: TracedModel) -> None:
    """Both graphs hold the same ops under the same names (only their shapes differ), so one
    placement places both; a ``TraceError`` where the model branched on the sequence length.
    Ops that launch nothing may differ (on the meta device the prompt's attention output
    takes a ``contiguous`` one token's does not): folding puts them in their producers."""
    if _skeleton(prefill) != _skeleton(decode):
        raise TraceError("the prompt's pass and one token's traced into different graphs (the "
                         "model branches on the sequence length), so one placement cannot "
                         "place both: plan it without --generate")
