#!/usr/bin/env python3
"""Module-level import cycles of the rttscope library.

Reads `cargo modules dependencies` output (DOT) on stdin: every item node
with its "uses" edges. Each item is folded into the module that defines it,
and the module -> module "uses" graph is checked for cycles (Tarjan's strongly
connected components). cargo-modules' own --acyclic works at item level,
where a type and its methods always form a cycle, so it cannot answer this.
Exit 0 when acyclic; else print every cycle and exit 1.
"""
import re
import sys

node_re = re.compile(r'^\s*"([^"]+)" \[label="([^|"]*)\|')
edge_re = re.compile(r'^\s*"([^"]+)" -> "([^"]+)" \[label="uses"')

modules = set()
items = set()
edges = []
for line in sys.stdin:
    m = edge_re.match(line)
    if m:
        edges.append((m.group(1), m.group(2)))
        continue
    m = node_re.match(line)
    if m:
        name, kind = m.group(1), m.group(2)
        items.add(name)
        if kind.endswith("mod") or kind == "crate":
            modules.add(name)

if not modules:
    sys.exit("check-modules: no module in the input (did cargo modules run?)")


def module_of(item):
    parts = item.split("::")
    for n in range(len(parts), 0, -1):
        cand = "::".join(parts[:n])
        if cand in modules:
            return cand
    return None


graph = {m: set() for m in modules}
why = {}
for a, b in edges:
    ma, mb = module_of(a), module_of(b)
    if ma is None or mb is None or ma == mb:
        continue
    graph[ma].add(mb)
    why.setdefault((ma, mb), f"{a} uses {b}")

sys.setrecursionlimit(10000)
index, low, on, stack, sccs = {}, {}, set(), [], []
counter = [0]


def strong(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in graph[v]:
        if w not in index:
            strong(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))


for v in sorted(graph):
    if v not in index:
        strong(v)

n_edges = sum(len(s) for s in graph.values())
if not sccs:
    print(f"check-modules: {len(modules)} modules, {n_edges} module-to-module uses, no cycle")
    sys.exit(0)
for comp in sccs:
    print("cycle among: " + ", ".join(comp))
    for a in comp:
        for b in sorted(graph[a]):
            if b in comp:
                print(f"  {a} -> {b}   ({why[(a, b)]})")
sys.exit(1)
