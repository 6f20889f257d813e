"""Weights streamed from a checkpoint (``autoplace plan --checkpoint``,
``emit/files/checkpoint.py``): a tiny Llama saved with ``save_pretrained`` (one file, and sharded)
plans, verifies and loads back from the checkpoint; a checkpoint that lacks tensors or holds wrong
shapes is refused with
their names and nothing written; a changed checkpoint is refused at load; loading one segment
reads only that segment's tensors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import safetensors.torch
import torch

from autoplace.cli import main
from autoplace.emit import load_model
from autoplace.emit.files import checkpoint as checkpoint_module
from autoplace.emit.files.checkpoint import match, open_checkpoint
from autoplace.errors import EmitError, ModelLoadError

transformers = pytest.importorskip("transformers")

# 2 layers of width 32 over a 128-token vocabulary, lm_head tied to embed_tokens (save_pretrained
# keeps one of them), rotary inv_freq a non-persistent buffer (save_pretrained keeps neither).
CONFIG = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 32, "use_cache": False, "tie_word_embeddings": True}
IDS = torch.arange(8).unsqueeze(0) * 7 % 128

MODEL_FILE = f"""
import torch
from accelerate import init_empty_weights
from transformers import LlamaConfig, LlamaForCausalLM

def build():
    with init_empty_weights():  # weights on meta: they come from --checkpoint
        model = LlamaForCausalLM(LlamaConfig(**{CONFIG!r}))
    return model, {{"input_ids": torch.arange(8).unsqueeze(0) * 7 % 128}}
"""
PLAN = ["--devices", "2xA100-40GB", "--no-profile", "--time-limit", "2"]
# throughput on contiguous stages splits even this tiny model over both devices
SPLIT = ["--objective", "throughput", "--contiguous", "--min-gain", "0"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The original model, its logits, and its checkpoint saved one-file and sharded."""
    root = tmp_path_factory.mktemp("checkpoint")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    model.save_pretrained(root / "single")
    model.save_pretrained(root / "sharded", max_shard_size="20KB")
    (root / "model.py").write_text(MODEL_FILE)
    with torch.no_grad():
        logits = model(input_ids=IDS).logits
    return {"root": root, "model": model, "logits": logits}


def _plan(saved: dict, checkpoint: Path, out: Path, *extra: str) -> int:
    return main(["plan", str(saved["root"] / "model.py"), *PLAN, *extra,
                 "--checkpoint", str(checkpoint), "--out", str(out)])


def _load(out: Path, **kwargs: object) -> torch.nn.Module:
    return load_model(out / "model", device_map={"cuda:0": "cpu", "cuda:1": "cpu"}, **kwargs)


@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_plan_with_a_checkpoint_verifies_and_refers_to_it(saved, layout, tmp_path):
    checkpoint = saved["root"] / layout
    assert _plan(saved, checkpoint, tmp_path / "out", *SPLIT) == 0
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["verification"]["status"] == "passed"
    meta = json.loads((tmp_path / "out" / "model" / "meta.json").read_text())
    assert {seg["device"] for seg in meta["segments"]} == {"cuda:0", "cuda:1"}
    refs = meta["checkpoint"]["tensors"]
    files = {p.name for p in checkpoint.glob("*.safetensors")}
    assert {r["file"] for r in refs.values()} == files  # every shard is read from
    # Every weight is read from the checkpoint; the tied lm_head under embed_tokens' key.
    keys = {r["key"] for r in refs.values()}
    assert keys == set(open_checkpoint(checkpoint).entries)
    assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys
    own = safetensors.torch.load_file(tmp_path / "out" / "model" / "weights.safetensors")
    assert {k.partition(".")[2] for k in own} <= {"model.rotary_emb.inv_freq"}
    assert (tmp_path / "out" / "model" / "weights.safetensors").stat().st_size < 1024

    loaded = _load(tmp_path / "out")
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=IDS).logits, saved["logits"])


def test_missing_and_misshaped_tensors_are_named_and_nothing_is_written(saved, tmp_path,
                                                                          capsys):
    state = safetensors.torch.load_file(saved["root"] / "single" / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    state["model.norm.weight"] = torch.ones(31)
    bad = tmp_path / "bad.safetensors"
    safetensors.torch.save_file(state, bad)
    assert _plan(saved, bad, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "model.layers.1.mlp.up_proj.weight" in err and str(bad) in err
    assert "model.norm.weight ([31] float32 in bad.safetensors, the model's is [32] float32)" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_many_missing_tensors_show_a_few_and_the_count(saved):
    keep = {"model.norm.weight": torch.ones(32)}
    path = saved["root"] / "few.safetensors"
    safetensors.torch.save_file(keep, path)
    with pytest.raises(ModelLoadError, match=r"lacks 19 tensor\(s\): .* and 14 more"):
        match(saved["model"], open_checkpoint(path))


def test_a_directory_without_safetensors_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="model.safetensors.index.json"):
        open_checkpoint(tmp_path)


def test_a_changed_checkpoint_is_refused_at_load(saved, tmp_path):
    checkpoint = tmp_path / "ck"
    saved["model"].save_pretrained(checkpoint, max_shard_size="20KB")
    assert _plan(saved, checkpoint, tmp_path / "out") == 0
    shard = sorted(checkpoint.glob("*.safetensors"))[0]
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    with pytest.raises(EmitError, match=rf"changed since.*{shard.name}"):
        _load(tmp_path / "out")
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    _load(tmp_path / "out")  # back as it was: loads


def test_loading_one_segment_reads_only_its_tensors(saved, tmp_path, monkeypatch):
    assert _plan(saved, saved["root"] / "sharded", tmp_path / "out", *SPLIT) == 0
    meta = json.loads((tmp_path / "out" / "model" / "meta.json").read_text())
    refs = meta["checkpoint"]["tensors"]
    requested: list[str] = []
    real = checkpoint_module.safe_open

    class Recording:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.inner = real(*args, **kwargs)

        def __enter__(self) -> Recording:
            self.inner.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self.inner.__exit__(*exc)

        def get_tensor(self, key: str) -> torch.Tensor:
            requested.append(key)
            return self.inner.get_tensor(key)

    monkeypatch.setattr(checkpoint_module, "safe_open", Recording)
    held: dict[int, int] = {}
    for name in refs:
        index = int(name[3:].partition(".")[0])
        held[index] = held.get(index, 0) + 1
    mine = [min(held, key=held.__getitem__)]  # a segment holding some of the weights
    assert held[mine[0]] < len(refs)
    model = _load(tmp_path / "out", segments=mine)
    wanted = {r["key"] for name, r in refs.items() if int(name[3:].partition(".")[0]) in mine}
    assert wanted and sorted(requested) == sorted(wanted)
    for seg in meta["segments"]:
        tensors = getattr(model, f"seg{seg['index']}").state_dict().values()
        assert all(t.is_meta != (seg["index"] in mine) for t in tensors)


def test_a_meta_model_too_large_to_load_is_emitted_without_its_weights(saved, tmp_path,
                                                                          monkeypatch, capsys):
    monkeypatch.setattr(checkpoint_module, "_FIT_SHARE", 0.0)  # as if memory were short
    assert _plan(saved, saved["root"] / "sharded", tmp_path / "out", *SPLIT) == 0
    assert "the model stays on the meta device: it is not verified" in \
        " ".join(capsys.readouterr().out.split())
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["verification"]["status"] == "skipped"
    # Never loaded here, yet the emitted model reads the checkpoint and the buffers kept aside.
    own = safetensors.torch.load_file(tmp_path / "out" / "model" / "weights.safetensors")
    assert {k.partition(".")[2] for k in own} == {"model.rotary_emb.inv_freq"}
    assert not (tmp_path / "out" / "launch.py").exists()  # its shapes need a pass with weights
    loaded = _load(tmp_path / "out")
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=IDS).logits, saved["logits"])


def test_a_buffer_built_on_meta_and_not_saved_says_how_to_build_the_model(saved):
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    with pytest.raises(ModelLoadError, match=r"lacks the buffers 2 tensor\(s\): "
                       r"model.rotary_emb.inv_freq.*init_empty_weights"):
        match(model, open_checkpoint(saved["root"] / "single"))


def test_floating_dtypes_are_cast_and_others_refused(saved, tmp_path):
    state = safetensors.torch.load_file(saved["root"] / "single" / "model.safetensors")
    half = tmp_path / "half.safetensors"
    safetensors.torch.save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, half)
    keys = match(saved["model"], open_checkpoint(half))  # float32 model, bfloat16 checkpoint
    assert keys["lm_head.weight"] == keys["model.embed_tokens.weight"] == (
        "model.embed_tokens.weight")
    ints = tmp_path / "ints.safetensors"
    safetensors.torch.save_file({**state, "model.norm.weight": torch.ones(32, dtype=torch.int32)},
                                ints)
    with pytest.raises(ModelLoadError, match=r"model.norm.weight \(\[32\] int32"):
        match(saved["model"], open_checkpoint(ints))
