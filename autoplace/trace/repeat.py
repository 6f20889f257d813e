"""A model's repeated blocks exported once: the longest ``nn.ModuleList`` of alike blocks (one
class, tensors of the same names, shapes and dtypes, equal plain attributes but for their index,
no hooks; the first may differ) is exported with its first ``KEPT`` blocks, and the ops of the
last copied for each block after it, reading that block's own parameters: the graph
torch.export gives the whole model, node for node and name for name (``tests/test_repeat.py``),
in the time of a few blocks. Where the traced blocks do not repeat (the last two differ, a later
op reads a block before the last, the short list does not export or its length is read) the
model is exported whole."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from autoplace.trace.load import kept_state

# Blocks exported: the last is copied, checked against the one before it, which reads a block
# before it as the last does (the first block reads the embedding, not a block).
KEPT = 3

# A copied op's meta names the op of the last traced block it copies: the counting pass takes
# that op's results (``count.CountingInterpreter``), the same shapes, FLOPs and bytes.
REPEAT_OF = "autoplace_repeat_of"

_PLAIN = (int, float, bool, str, type(None))
_SUFFIX = re.compile(r"(.*)_(\d+)$")  # torch.fx's own: a name's base and number


@dataclass(frozen=True)
class Blocks:
    """The repeated blocks of a model: ``path`` (the list's name in the model), their number."""

    path: str
    count: int


def repeated_blocks(model: torch.nn.Module) -> Blocks | None:
    """The longest ``nn.ModuleList`` of more than ``KEPT`` blocks in ``model`` whose blocks
    after the first are alike (the first is traced, and may differ: T5's holds the position
    bias), else ``None``."""
    best: Blocks | None = None
    for name, module in model.named_modules():
        if (isinstance(module, torch.nn.ModuleList) and len(module) > KEPT and name
                and (best is None or len(module) > best.count) and _alike(list(module)[1:])):
            best = Blocks(path=name, count=len(module))
    return best


def export_repeated(model: torch.nn.Module, blocks: Blocks,
                    export: Callable[[], torch.fx.GraphModule],
                    example: tuple[tuple, dict] | None = None) -> torch.fx.GraphModule | None:
    """``export()`` run with ``blocks`` cut to their first ``KEPT``, its graph grown to every
    block (``_grow``) and, given the ``example`` inputs (a model with weights), checked to
    compute what ``model`` does on them; ``None`` where the short model does not export, its
    blocks do not repeat or the check fails (the forward treats a later block apart, say):
    the caller exports the whole model."""
    try:
        with _first(model, blocks.path, KEPT):
            gm = export()
    except Exception:  # the model needs its whole list (it indexes past the cut, say)
        return None
    grown = _grow(gm, model, blocks)
    if grown is None or example is None or _computes_as(grown, model, *example):
        return grown
    return None


def _computes_as(gm: torch.fx.GraphModule, model: torch.nn.Module, args: tuple,
                 kwargs: dict) -> bool:
    """Whether ``gm`` and ``model`` give equal outputs on ``args``/``kwargs``, each run
    without gradients from one random state (dropout draws alike), the random state and the
    buffers (batch norm's running statistics, which ``gm`` shares) restored after each
    (``load.kept_state``)."""
    outputs = []
    try:
        for run in (model, gm):
            with kept_state(model), torch.no_grad():
                torch.manual_seed(0)
                outputs.append(run(*args, **kwargs))
        torch.testing.assert_close(outputs[1], outputs[0])
    except Exception:  # unequal, or not comparable: not known to be the model's graph
        return False
    return True


@contextlib.contextmanager
def _first(model: torch.nn.Module, path: str, kept: int) -> Iterator[None]:
    """``model`` with the list at ``path`` cut to its first ``kept`` blocks, which refuse
    ``len()``: a forward that reads the list's length (to scale by it, say) would trace
    another graph than the whole model's."""
    parent_name, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_name)
    whole = parent._modules[attr]
    cut = torch.nn.ModuleList(list(whole)[:kept])
    cut.__class__ = _Cut
    parent._modules[attr] = cut
    try:
        yield
    finally:
        parent._modules[attr] = whole


class _Cut(torch.nn.ModuleList):
    """A list of blocks cut short: iterated and sliced as a list, its length unknown."""

    def __len__(self) -> int:
        raise TypeError("the length of a list of blocks cut short is not its own")

    def __getitem__(self, index: Any) -> Any:
        blocks = list(self._modules.values())
        return torch.nn.ModuleList(blocks[index]) if isinstance(index, slice) else blocks[index]


def _alike(blocks: list[torch.nn.Module]) -> bool:
    """Whether ``blocks`` (those after the first) would trace to one graph: distinct modules
    of one structure, their tensors distinct and shaped alike, their plain attributes equal
    or each its block's index (as transformers' ``layer_idx``), other attributes the same
    objects, and no hooks (which may differ by block)."""
    seen: set[int] = set()
    first: tuple | None = None
    for index, block in enumerate(blocks, start=1):
        tensors = [*block.named_parameters(remove_duplicate=False),
                   *block.named_buffers(remove_duplicate=False)]
        if id(block) in seen or any(id(t) in seen for _, t in tensors):
            return False  # a module or tensor shared by blocks: copies would not share it
        seen.update([id(block), *(id(t) for _, t in tensors)])
        try:
            key = (tuple((n, type(m)) for n, m in block.named_modules()),
                   tuple((n, tuple(t.shape), t.dtype, t.requires_grad) for n, t in tensors),
                   index, [(n, a, v) for n, m in block.named_modules()
                           for a, v in _attributes(m)])
        except TypeError:
            return False
        if first is None:
            first = key
        elif key[:2] != first[:2] or not _same_attributes(first, key):
            return False
    return True


def _same_attributes(a: tuple, b: tuple) -> bool:
    """Whether two blocks' attributes (``_alike``'s keys) are equal, or each its block's
    index."""
    if [x[:2] for x in a[3]] != [x[:2] for x in b[3]]:
        return False
    return all(u == v or (type(u) is int and type(v) is int and (u, v) == (a[2], b[2]))
               for (_, _, u), (_, _, v) in zip(a[3], b[3]))


def _attributes(module: torch.nn.Module) -> list[tuple[str, Any]]:
    """``module``'s own attributes, each a plain value or an object's identity;
    ``TypeError`` where it has hooks."""
    if any(getattr(module, hooks, None) for hooks in (
            "_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
            "_backward_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks")):
        raise TypeError("hooks")
    found = []
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or name == "training":
            continue
        if isinstance(value, _PLAIN) or (isinstance(value, tuple)
                                         and all(isinstance(v, _PLAIN) for v in value)):
            found.append((name, value))
        else:
            found.append((name, ("object", id(value))))
    return found


def _block_of(node: torch.fx.Node, path: str) -> int | None:
    """The index of the block ``node`` runs in (its module stack's, or its parameter's name),
    else ``None``."""
    if node.op in ("get_attr", "call_module"):  # export's _guards_fn takes a block's stack
        names = [str(node.target)]
    else:
        stack = node.meta.get("nn_module_stack") or {}
        names = [str(v[0]) for v in stack.values()]
    for name in names:
        name = name.removeprefix("L['self'].").removeprefix("L__self__.")
        if name.startswith(path + "."):
            head = name[len(path) + 1:].split(".", 1)[0]
            if head.isdigit():
                return int(head)
    return None


def _grow(gm: torch.fx.GraphModule, model: torch.nn.Module, blocks: Blocks
          ) -> torch.fx.GraphModule | None:
    """``gm`` (the graph of ``KEPT`` blocks) with the last block's ops and parameter reads
    copied for blocks ``KEPT`` to ``count - 1``, each copy reading the one before it, and the
    ops after the blocks reading the last copy; ``None`` where the traced blocks do not
    repeat."""
    nodes = list(gm.graph.nodes)
    ops: dict[int, list[torch.fx.Node]] = {}
    attrs: dict[int, list[torch.fx.Node]] = {}
    where: dict[torch.fx.Node, int] = {}
    for n in nodes:
        if n.op in ("placeholder", "output"):
            continue
        i = _block_of(n, blocks.path)
        if i is not None:
            (attrs if n.op == "get_attr" else ops).setdefault(i, []).append(n)
            where[n] = i
    last = KEPT - 1
    if sorted(ops) != list(range(KEPT)) or not _contiguous(nodes, ops):
        return None
    local = {n: k - len(block) for block in ops.values() for k, n in enumerate(block)}
    if _code(ops[last], where, local, blocks.path, last) != _code(
            ops[last - 1], where, local, blocks.path, last - 1):
        return None
    if any(i.op == "get_attr" and where.get(i, last) != last
           for t in ops[last] for i in t.all_input_nodes):
        return None  # the block reads another block's parameter: a copy would read the same
    after = nodes[nodes.index(ops[last][-1]) + 1:]
    if any(i in where and (where[i] != last or i.op == "get_attr")
           for n in after for i in n.all_input_nodes):
        return None  # an op after the blocks reads another block, or a block's parameter
    grown = _copied(gm, nodes, ops, attrs.get(last, []), blocks)
    for n in grown.nodes:
        if n.op == "get_attr" and (_block_of(n, blocks.path) or 0) > last:
            torch.fx.graph_module._copy_attr(model, gm, str(n.target))
    gm.graph = grown  # which recompiles it
    return gm


def _contiguous(nodes: list[torch.fx.Node], ops: dict[int, list[torch.fx.Node]]) -> bool:
    """Whether the blocks' ops run one block after another, nothing between them."""
    at = {n: k for k, n in enumerate(nodes)}
    spans = [(at[ops[i][0]], at[ops[i][-1]], len(ops[i])) for i in sorted(ops)]
    return all(end - start + 1 == size for start, end, size in spans) and all(
        a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))


def _code(block: list[torch.fx.Node], where: dict[torch.fx.Node, int],
          local: dict[torch.fx.Node, int], path: str, index: int) -> list:
    """The ops of the block at ``index`` as comparable code: each op's kind, target, module
    stack and arguments, an op read as (its block less this one's index, its place from its
    block's end: the first block may begin with more), a block's parameter as (the same, its
    name within the block), any other node as itself."""

    def arg(value: Any) -> Any:
        if isinstance(value, torch.fx.Node) and value in where:
            i = where[value]
            if value.op == "get_attr":
                return ("attr", i - index, str(value.target).removeprefix(f"{path}.{i}."))
            return ("op", i - index, local[value])
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, tuple(arg(v) for v in value))
        if isinstance(value, dict):
            return ("dict", tuple((k, arg(v)) for k, v in value.items()))
        return value

    return [(n.op, n.target, arg(n.args), arg(n.kwargs),
             _renamed(n.meta.get("nn_module_stack"), path, index, -1)) for n in block]


def _copied(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node],
            ops: dict[int, list[torch.fx.Node]], reads: list[torch.fx.Node], blocks: Blocks
            ) -> torch.fx.Graph:
    """A new graph of ``nodes`` with the last traced block's ops (``ops``) and parameter reads
    (``reads``) copied for each later block, right after the originals. A copy, and every
    node after the blocks, is named by its name's base (``_SUFFIX``), which torch.fx numbers
    on from the names taken: as the whole model's graph names it."""
    last = KEPT - 1
    template = ops[last]
    prior = {n: k - len(ops[last - 1]) for k, n in enumerate(ops[last - 1])}
    graph = torch.fx.Graph(owning_module=gm)
    graph._codegen = gm.graph._codegen
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    read: dict[int, dict[torch.fx.Node, torch.fx.Node]] = {j: {} for j in range(
        KEPT, blocks.count)}
    renumber = False
    for n in nodes:
        env[n] = _make(graph, n, env.__getitem__, _base(n.name) if renumber else n.name)
        if reads and n is reads[-1]:
            for j, mine in read.items():
                for r in reads:
                    target = _retarget(str(r.target), blocks.path, last, j)
                    mine[r] = _make(graph, r, env.__getitem__, target.replace(".", "_"),
                                    target=target)
        if n is template[-1]:
            before = {t: env[t] for t in template}  # block KEPT - 1's ops, as copied
            for j in range(KEPT, blocks.count):
                copy: dict[torch.fx.Node, torch.fx.Node] = {}

                def lookup(x: torch.fx.Node, j: int = j, copy: dict = copy,
                           before: dict = before) -> torch.fx.Node:
                    if x in copy:
                        return copy[x]
                    if x in read[j]:
                        return read[j][x]
                    if x in prior:  # the block before's op at the same place
                        return before[template[prior[x]]]
                    return env[x]

                for t in template:
                    copy[t] = _make(graph, t, lookup, _base(t.name))
                    copy[t].meta["nn_module_stack"] = _renamed(
                        t.meta.get("nn_module_stack"), blocks.path, last, j)
                    copy[t].meta[REPEAT_OF] = t.name
                before = copy
            env.update(before)  # what follows reads the last block's ops
            renumber = True
    return graph


def _make(graph: torch.fx.Graph, n: torch.fx.Node, lookup: Callable, name: str, *,
          target: Any = None) -> torch.fx.Node:
    """``n`` made in ``graph`` as ``name`` (torch.fx numbers it where taken), its inputs
    looked up, its meta copied."""
    made = graph.create_node(n.op, n.target if target is None else target,
                             torch.fx.node.map_arg(n.args, lookup),
                             torch.fx.node.map_arg(n.kwargs, lookup), name, n.type)
    made.meta = dict(n.meta)
    return made


def _base(name: str) -> str:
    match = _SUFFIX.match(name)
    return match.group(1) if match else name


def _retarget(name: str, path: str, old: int, new: int) -> str:
    return re.sub(re.escape(f"{path}.{old}") + r"(?=\.|$)", f"{path}.{new}", name)


def _renamed(stack: dict | None, path: str, old: int, new: int) -> dict | None:
    """A module stack of a node of block ``old`` as block ``new``'s: each module's key and
    name renamed."""
    if stack is None:
        return None
    return {_retarget(k, path, old, new): (_retarget(v[0], path, old, new), *v[1:])
            for k, v in stack.items()}
