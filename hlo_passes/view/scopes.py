"""Instructions grouped by the model's layer structure: the `op_name` scopes JAX writes.

JAX names every op after the trace it came from, `jit(step)/jvp(layer3)/attn/dot_general`;
everything but the last component is the scope (`jax.named_scope`, `jvp`, `transpose(...)` for
the backward pass, nested `jit`s).  A 25k-instruction training step opens as a few dozen
groups — one per layer forward and backward, the loss, the optimizer — instead of 25k boxes.

    tree = group_instructions(op_names, opcodes, is_parameter, operands)
    tree.groups[0]              # the root: the computation itself
    tree.group_of[i]            # innermost group of instruction i

Rules, in order:

1. The scope path is the op_name split at `/` outside brackets, without its last component;
   the prefix every scoped instruction shares (`jit(step)`) is dropped.
2. An instruction without an op_name (XLA-made constants, copies, tuples) takes the scope of
   its first scoped user, else of its first scoped operand: it stays beside the op it serves.
3. Parameters (when more than a few) go to one "parameters" group, nested by their pytree path
   (`params['blocks'][0]['wq']` → `params` / `['blocks']` / `[0]`).
4. A chain of groups holding nothing but one group each is one group (`jit(step)/jvp(f)`).
5. A group with more than `max_children` direct members gets its loose instructions packed
   into chunks of connected instructions (so that each chunk is a unit of dataflow, and few
   edges cross chunks), in program order; chunks are packed again when they are too many.

Deterministic: the same module gives the same groups (snapshot-tested).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

MAX_CHILDREN = 48  # direct members of a group before its loose instructions are chunked
CHUNK_SIZE = 32  # instructions per chunk
MIN_PARAMETERS_GROUP = 9  # fewer parameters than this stay where they are

_PYTREE_TOKEN = re.compile(r"\[[^\]]*\]|[^\[]+")


@dataclass
class Group:
    label: str
    parent: int  # -1 for the root
    kind: str  # "root" | "scope" | "parameters" | "chunk"
    scope: str = ""  # full scope path (a title for the label)
    children: list[int] = field(default_factory=list)  # child groups, in order of first appearance
    members: list[int] = field(default_factory=list)  # instructions directly in this group


@dataclass
class GroupTree:
    groups: list[Group]
    group_of: list[int]


def split_op_name(op_name: str) -> list[str]:
    """`jit(f)/jvp(g/h)/dot` → ['jit(f)', 'jvp(g/h)', 'dot']: `/` inside brackets does not split."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(op_name):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "/" and depth == 0:
            parts.append(op_name[start:i])
            start = i + 1
    parts.append(op_name[start:])
    return [p for p in parts if p]


def group_instructions(op_names: Sequence[str | None], opcodes: Sequence[str], is_parameter: Sequence[bool],
                       operands: Sequence[Sequence[int]], *, by_scope: bool = True,
                       max_children: int = MAX_CHILDREN, chunk_size: int = CHUNK_SIZE) -> GroupTree:
    """Group instructions 0..n-1 (in program order; `operands[i]` are indices of earlier ones).

    `by_scope=False` (fusion bodies, reducers) skips scopes and parameters: only chunking."""
    n = len(op_names)
    users: list[list[int]] = [[] for _ in range(n)]
    for i, ops in enumerate(operands):
        for o in ops:
            users[o].append(i)
    paths: list[tuple[str, ...] | None] = [None] * n
    if by_scope:
        for i, name in enumerate(op_names):
            if name and not is_parameter[i]:
                paths[i] = tuple(split_op_name(name)[:-1])
        _drop_common_prefix(paths)
        _inherit_scopes(paths, is_parameter, operands, users)
    groups = [Group("", -1, "root")]
    group_of = [0] * n
    index: dict[tuple, int] = {(): 0}

    def group_for(key: tuple, label_parts: tuple[str, ...], kind: str, parent_key: tuple) -> int:
        gid = index.get(key)
        if gid is None:
            parent = group_for(parent_key, label_parts[:-1], kind, parent_key[:-1]) if parent_key else 0
            gid = len(groups)
            groups.append(Group(label_parts[-1], parent, kind, "/".join(label_parts)))
            groups[parent].children.append(gid)
            index[key] = gid
        return gid

    parameters = [i for i in range(n) if is_parameter[i]]
    group_parameters = by_scope and len(parameters) >= MIN_PARAMETERS_GROUP
    for i in range(n):
        if group_parameters and is_parameter[i]:
            tokens = tuple(_PYTREE_TOKEN.findall(op_names[i] or ""))[:-1]
            parts = ("parameters",) + tokens
            key = ("\0p",) + tokens
            gid = group_for(key, parts, "parameters", key[:-1])
        elif paths[i]:
            gid = group_for(paths[i], paths[i], "scope", paths[i][:-1])
        else:
            gid = 0
        group_of[i] = gid
        groups[gid].members.append(i)
    for g in groups:  # the parameters group's sub-groups get the pytree path as their title
        if g.kind == "parameters":
            g.scope = g.scope.removeprefix("parameters/").replace("/", "") or "parameters"
    _merge_chains(groups, group_of)
    _chunk(groups, group_of, operands, opcodes, max_children, chunk_size)
    return _renumber(groups, group_of)


def _drop_common_prefix(paths: list[tuple[str, ...] | None]) -> None:
    scoped = [p for p in paths if p]
    if not scoped:
        return
    prefix = list(scoped[0])
    for p in scoped[1:]:
        k = 0
        while k < len(prefix) and k < len(p) and prefix[k] == p[k]:
            k += 1
        del prefix[k:]
        if not prefix:
            return
    cut = len(prefix)
    for i, p in enumerate(paths):
        if p:
            paths[i] = p[cut:]


def _inherit_scopes(paths, is_parameter, operands, users) -> None:
    n = len(paths)
    for i in reversed(range(n)):  # users come later: a reverse sweep sees them settled
        if paths[i] is None and not is_parameter[i]:
            paths[i] = next((paths[u] for u in users[i] if paths[u] is not None), None)
    for i in range(n):
        if paths[i] is None and not is_parameter[i]:
            paths[i] = next((paths[o] for o in operands[i] if paths[o] is not None), None)


def _merge_chains(groups: list[Group], group_of: list[int]) -> None:
    """A group whose only member is one child group absorbs it (labels joined with '/')."""
    for gid, g in enumerate(groups):
        while g.kind != "root" and not g.members and len(g.children) == 1:
            child = groups[g.children[0]]
            g.label = f"{g.label}/{child.label}"
            g.scope = child.scope
            g.children = child.children
            g.members = child.members
            for c in g.children:
                groups[c].parent = gid
            for i in g.members:
                group_of[i] = gid
            child.kind = "dead"
            child.children, child.members = [], []


def _chunk(groups: list[Group], group_of: list[int], operands, opcodes, max_children: int,
           chunk_size: int) -> None:
    for gid in range(len(groups)):
        g = groups[gid]
        if g.kind == "dead" or len(g.members) < 2 or len(g.members) + len(g.children) <= max_children:
            continue
        chunks = _connected_chunks(g.members, operands, chunk_size)
        new_ids = []
        for members in chunks:
            cid = len(groups)
            label = f"{len(members)} ops: {opcode_summary([opcodes[i] for i in members])}"
            groups.append(Group(label, gid, "chunk", g.scope, [], members))
            for i in members:
                group_of[i] = cid
            new_ids.append(cid)
        g.members = []
        # Too many chunks: chunks of chunks, in order.
        while len(new_ids) > 1 and len(new_ids) + len(g.children) > max_children:
            packed = []
            for k in range(0, len(new_ids), chunk_size):
                part = new_ids[k:k + chunk_size]
                if len(part) == 1:
                    packed.append(part[0])
                    continue
                pid = len(groups)
                count = sum(_size(groups, c) for c in part)
                groups.append(Group(f"{count} ops", gid, "chunk", g.scope, part, []))
                for c in part:
                    groups[c].parent = pid
                packed.append(pid)
            new_ids = packed
        g.children = g.children + new_ids


def _size(groups: list[Group], gid: int) -> int:
    g = groups[gid]
    return len(g.members) + sum(_size(groups, c) for c in g.children)


def _connected_chunks(members: list[int], operands, chunk_size: int) -> list[list[int]]:
    """`members` (in program order) packed into chunks of at most `chunk_size`: weakly connected
    components among them first, small components packed together in order of first member."""
    inside = set(members)
    parent = {i: i for i in members}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in members:
        for o in operands[i]:
            if o in inside:
                a, b = find(i), find(o)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    components: dict[int, list[int]] = {}
    for i in members:
        components.setdefault(find(i), []).append(i)
    chunks: list[list[int]] = []
    current: list[int] = []
    for comp in components.values():  # dict order: by first member, i.e. program order
        if len(current) + len(comp) > chunk_size and current:
            chunks.append(current)
            current = []
        while len(comp) > chunk_size:
            chunks.append(comp[:chunk_size])
            comp = comp[chunk_size:]
        current = current + comp
    if current:
        chunks.append(current)
    return chunks


def _renumber(groups: list[Group], group_of: list[int]) -> GroupTree:
    """Drop merged-away groups; number the rest depth-first from the root."""
    order: list[int] = []
    stack = [0]
    while stack:
        gid = stack.pop()
        order.append(gid)
        stack.extend(reversed(groups[gid].children))
    new_id = {old: k for k, old in enumerate(order)}
    out = []
    for old in order:
        g = groups[old]
        out.append(Group(g.label, new_id.get(g.parent, -1), g.kind, g.scope,
                         [new_id[c] for c in g.children], list(g.members)))
    return GroupTree(out, [new_id[g] for g in group_of])


def opcode_summary(opcodes: Sequence[str], limit: int = 3) -> str:
    """`multiply×12, add×8, …`: the commonest opcodes of a set of instructions."""
    counts = Counter(opcodes).most_common()
    text = ", ".join(f"{op}×{k}" for op, k in counts[:limit])
    return text + (", …" if len(counts) > limit else "")
