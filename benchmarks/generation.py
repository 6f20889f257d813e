"""Generation plans (``--generate 64``) measured here: tokens, cache, time per token.

    PYTHONPATH=. python benchmarks/generation.py    # writes benchmarks/results/generation.md

For a Llama-, a GPT-2- and a Qwen2-style model (random weights from configs), batch 4, a
64-token prompt and 64 new tokens, planned over two ``cpu-process`` workers that each hold 75%
of the weights and cache (so both hold part of the model), profiled here:

- the plan's own check: the emitted model's greedy tokens equal the original's
  ``generate(do_sample=False)``, and the cache it holds per device is the plan's;
- ``autoplace run OUT --generate 64``: the median decode step against the plan's;
- ``autoplace run OUT --generate 64 --nproc 2``: two gloo ranks generate the same tokens;
- the same model planned at ``--granularity module`` on two GPUs of the same room, its
  ``device_map`` loaded by ``from_pretrained`` (the GPUs mapped to this CPU: there are none
  here) and generating: its tokens against the original's.

The load average is printed: other work on the two cores slows the steps.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import autoplace  # noqa: E402
from autoplace.emit.generate import reference  # noqa: E402
from autoplace.trace.generate import layer_cache_bytes  # noqa: E402
from benchmarks.common import (  # noqa: E402
    capped,
    cli_json,
    machine_line,
    mb,
    weight_bytes,
    write_markdown,
)

BATCH, PROMPT, NEW = 4, 64, 64


def models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {
        "Llama (4 layers, width 512, GQA 8/4)": LlamaForCausalLM(LlamaConfig(
            vocab_size=16000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)),
        "GPT-2 (6 layers, width 384)": GPT2LMHeadModel(GPT2Config(
            n_layer=6, n_embd=384, n_head=6, vocab_size=8000, n_positions=256,
            bos_token_id=0, eos_token_id=0)),
        "Qwen2 (4 layers, width 384, GQA 6/2)": Qwen2ForCausalLM(Qwen2Config(
            vocab_size=12000, hidden_size=384, intermediate_size=1024, num_hidden_layers=4,
            num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)),
    }


def _from_pretrained(model: torch.nn.Module, prompt: torch.Tensor, room: int, tmp: Path) -> str:
    """The module-granularity map, loaded by ``from_pretrained`` with the GPUs on this CPU,
    generating: whether its tokens equal the original's, and the map's split."""
    planned = autoplace.plan(model, {"input_ids": prompt}, autoplace.Config(
        devices=capped("2xA100-40GB", room), granularity="module", generate=NEW))
    mapping = dict(planned.plan.device_map.map)
    model.save_pretrained(tmp / "saved")
    loaded = AutoModelForCausalLM.from_pretrained(
        tmp / "saved", device_map={k: "cpu" if isinstance(v, int) else v
                                   for k, v in mapping.items()})
    loaded.eval()
    same = torch.equal(reference(loaded, prompt, new_tokens=NEW),
                       reference(model, prompt, new_tokens=NEW))
    split = sorted({v for v in mapping.values()}, key=str)
    return f"{'equal' if same else 'DIFFER'} (map over {', '.join(map(str, split))})"


def row(name: str, model: torch.nn.Module, tmp: Path) -> str:
    model.eval()
    prompt = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT),
                           generator=torch.Generator().manual_seed(1))
    cache = sum(layer_cache_bytes(model, batch=BATCH, max_len=PROMPT + NEW).values())
    room = int(0.75 * (weight_bytes(model) + cache))
    planned = autoplace.plan(model, {"input_ids": prompt}, autoplace.Config(
        devices=capped("2xcpu-process", room), generate=NEW, cost=autoplace.Cost(profile=True)))
    out = tmp / "out"
    autoplace.save(planned, out)
    gen = planned.plan.generation
    one = cli_json("run", str(out), "--generate", str(NEW))
    ranks = cli_json("run", str(out), "--generate", str(NEW), "--nproc", "2")
    mapped = _from_pretrained(model, prompt, room, tmp)
    return (f"| {name} | {', '.join(f'{d} {mb(b)}' for d, b in gen.cache_bytes.items())} | "
            f"{', '.join(f'{d} {mb(b)}' for d, b in (gen.measured_cache_bytes or {}).items())}"
            f" | {gen.check} | equal ({ranks['ranks']} ranks) | {mapped} | "
            f"{gen.step_s * 1e3:.2f} | {one['ms_per_token']:.2f} "
            f"({one['ms_per_token'] / (gen.step_s * 1e3):.2f}) | "
            f"{ranks['ms_per_token']:.2f} |")


def main() -> int:
    lines = [
        "# Generation plans: tokens, cache and time per token", "",
        f"`PYTHONPATH=. python benchmarks/generation.py`; {machine_line()}; load average "
        f"{os.getloadavg()[0]:.1f} at the start.", "",
        f"Batch {BATCH}, a {PROMPT}-token prompt, {NEW} new tokens, float32, over 2 cpu-process "
        "workers that each hold 75% of the weights and cache, profiled here. Cache: the plan's "
        "per device, and what the emitted model's segments hold. Tokens: the emitted model's "
        "(the plan's check), two gloo ranks' (`autoplace run OUT --generate 64 --nproc 2`, "
        "which checks them against the emitted model's) and the module-granularity "
        "`device_map` loaded by `from_pretrained` with its two GPUs mapped to this CPU, each "
        "against the original's `generate(do_sample=False)`. Time per token: predicted, "
        "measured by `autoplace run OUT --generate 64` (measured/predicted), and by the ranks.",
        "", "| model | cache per device (plan), MB | cache held (emitted), MB | emitted tokens | "
        "ranks' tokens | from_pretrained tokens | predicted ms/token | measured ms/token | "
        "ranks ms/token |", "|---|---|---|---|---|---|---:|---:|---:|"]
    for name, model in models().items():
        with tempfile.TemporaryDirectory() as tmp:
            lines.append(row(name, model, Path(tmp)))
        print(lines[-1], flush=True)
    lines += ["", f"Load average at the end: {os.getloadavg()[0]:.1f}."]
    write_markdown(ROOT / "benchmarks" / "results" / "generation.md", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
