"""In-place writes nothing reads: removed from a traced graph before it is placed.

torch.export's graph keeps in-place ops (``add_``), and the emitted model runs a graph's ops in
segments that a plan may spread over devices, ordered only by the values that flow between
them: a write into a tensor is ordered after the reads that came before it in the graph by
nothing. ``drop_dead_writes`` removes the writes that cannot matter: an in-place op on an
intermediate value whose result nothing uses and whose tensor (with every view of it) nothing
reads after it, as transformers' static cache does when it counts the tokens it has written
(``cumulative_length.add_``) after reading where to write them.
"""

from __future__ import annotations

import torch
import torch.fx

from autoplace.trace.count import op_name

__all__ = ["drop_dead_writes"]

# Ops whose output may share its input's storage: a write into one is a write into the other.
_ALIASING = frozenset({
    "view", "_unsafe_view", "view_as", "t", "transpose", "permute", "expand", "expand_as",
    "slice", "select", "narrow", "unsqueeze", "squeeze", "alias", "detach", "as_strided",
    "split", "split_with_sizes", "chunk", "unbind", "reshape", "flatten", "unflatten", "to",
    "type_as", "contiguous", "getitem",
})


def _in_place(node: torch.fx.Node) -> bool:
    """An aten op that writes into its first argument (``add_``, ``index_copy_``, ...)."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or not schema.arguments:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and alias.is_write


def _storage(node: torch.fx.Node) -> set[torch.fx.Node]:
    """``node`` and every node that may share its storage: up through the ops it is a view or
    an alias of, then down through every view or alias of those."""
    base = node
    while (base.op == "call_function" and op_name(base.target) in _ALIASING and base.args
           and isinstance(base.args[0], torch.fx.Node)):
        base = base.args[0]
    found, todo = set(), [base]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.add(current)
        todo += [user for user in current.users
                 if user.op == "call_function"
                 and (op_name(user.target) in _ALIASING or _in_place(user))
                 and user.args and user.args[0] is current]
    return found


def drop_dead_writes(gm: torch.fx.GraphModule) -> list[str]:
    """Remove the in-place ops of ``gm`` that write into an intermediate value (not a
    parameter, buffer or input) that nothing reads after them and whose result nothing uses;
    the names removed."""
    position = {node: i for i, node in enumerate(gm.graph.nodes)}
    dead = []
    for node in gm.graph.nodes:
        if not _in_place(node) or node.users or not isinstance(node.args[0], torch.fx.Node):
            continue
        storage = _storage(node.args[0])
        if any(n.op in ("get_attr", "placeholder") for n in storage):
            continue
        read_after = any(position[user] > position[node] for n in storage for user in n.users
                         if user is not node)
        if not read_after:
            dead.append(node)
    for node in dead:
        gm.graph.erase_node(node)
    if dead:
        gm.recompile()
    return [node.name for node in dead]
