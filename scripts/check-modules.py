#!/usr/bin/env python3
"""Module-level import cycles and arrows back up the layers of the rttscope library.

Reads `cargo modules dependencies` output (DOT): every item node
with its "uses" edges. Each item is folded into the module that defines it,
and the module -> module "uses" graph is checked:

- for cycles (Tarjan's strongly connected components). cargo-modules' own
  --acyclic works at item level, where a type and its methods always form a
  cycle, so it cannot answer this;
- for arrows back up the layers: the crate's top-level modules are layered
  (LAYERS below, lowest first), and a module may use only modules of a lower
  layer or of its own top-level module; a use of the same layer's other
  top-level module (views and active) is an arrow sideways and fails too;
- inside `views`, for the plug-in rule: the framework every view is written
  against (VIEW_FRAMEWORK) uses no view's folder, and no view's folder uses
  another's; only the registry (`views` itself) names them.

Also printed, not failed: the uses of a view's folder from outside `views`
(each is a place a new view may have to touch; issue 24).

cargo-modules sees `use` declarations only. When it runs cargo modules itself, the
script also reads the library's sources for inline paths (`crate::views::sampler::f(..)`
in code, tests and comments left out): an inline path from one view's folder into
another's fails as a `use` would (issue 42); the other inline arrows up the layers are
printed, not failed.
Exit 0 when all hold; else print every cycle and arrow and exit 1.

Input: `check-modules.py -` reads the graph from stdin, `check-modules.py
FILE` from FILE; with no argument it reads stdin when that is a redirected
file (`< graph.dot`), and otherwise runs `cargo modules dependencies` itself
(from the repository root). A pipe is read only with `-`: a CI runner's stdin
is not a terminal either, and may be a pipe that never ends. When
cargo-modules is not installed (`cargo install cargo-modules`), or the graph is
empty, it says so in one line and exits 2: nothing was checked.
"""
import os
import re
import shutil
import stat
import subprocess
import sys

CMD = [
    "cargo", "modules", "dependencies", "--package", "rttscope", "--lib",
    "--features", "aya", "--no-externs", "--no-sysroot",
]
NOT_INSTALLED = "check-modules: cargo-modules is not installed (cargo install cargo-modules): module graph not checked"


def not_checked(why):
    print(why, file=sys.stderr)
    sys.exit(2)


USAGE = "usage: check-modules.py [- | FILE]  (no argument: run cargo modules, or read a redirected stdin)"


def given(text, where):
    if not text.strip():
        not_checked(f"check-modules: empty input from {where} (did `cargo modules dependencies` run? "
                    "is cargo-modules installed?): module graph not checked")
    return text.splitlines()


def stdin_mode():
    try:
        return os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return 0


def run_cargo_modules():
    if shutil.which("cargo-modules") is None:
        not_checked(NOT_INSTALLED)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    r = subprocess.run(CMD, cwd=root, capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        not_checked(f"check-modules: `{' '.join(CMD)}` failed: {last}")
    return r.stdout.splitlines()


FROM_CARGO = []


def graph_lines():
    """The DOT graph: from `-` (stdin), FILE, a redirected stdin, or cargo modules."""
    args = sys.argv[1:]
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0)
    if len(args) > 1:
        not_checked(USAGE)
    if args == ["-"]:
        return given(sys.stdin.read(), "stdin")
    if args:
        try:
            with open(args[0]) as f:
                return given(f.read(), args[0])
        except OSError as e:
            not_checked(f"check-modules: cannot read {args[0]}: {e.strerror}: module graph not checked")
    mode = stdin_mode()
    if stat.S_ISREG(mode):
        text = sys.stdin.read()
        if text.strip():
            return text.splitlines()
    elif stat.S_ISFIFO(mode):
        print("check-modules: stdin is a pipe, not read (pass - to read it); running cargo modules",
              file=sys.stderr)
    FROM_CARGO.append(True)
    return run_cargo_modules()


SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "userspace", "src")
TEST_MOD = re.compile(r"#\[cfg\((?:all\()?test\b[^\n]*\]\s*\n\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
INLINE = re.compile(r"\bcrate((?:::[a-z_][a-z0-9_]*)+)")


def module_of_file(rel):
    """`views/tcp/mod.rs` -> `rttscope::views::tcp`."""
    parts = rel[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return "::".join(["rttscope"] + parts)


def code_only(text):
    """A file's code before its inline test module, without string literals and comments."""
    m = TEST_MOD.search(text)
    if m:
        text = text[:m.start()]
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def inline_uses():
    """(module, module, why) of every inline `crate::...` path in the library's code."""
    out = []
    for d, _, files in os.walk(SRC):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(d, f)
            src = module_of_file(os.path.relpath(path, SRC))
            if src not in modules:
                continue
            with open(path) as fh:
                text = code_only(fh.read())
            for m in INLINE.finditer(text):
                dst = module_of("rttscope" + m.group(1))
                if dst is not None and dst != src:
                    line = text.count("\n", 0, m.start()) + 1
                    out.append((src, dst, f"{os.path.relpath(path, SRC)}:{line} names crate{m.group(1)}"))
    return out


# Lowest first. bpf: the C/Rust contract (generated types, constants);
# analysis: the vocabulary (flows, records, results, statistics, units), pure
# code; sys: the operating system (netns, cgroups, sock_diag, bpf syscalls);
# then what measures (the passive views, the active engine, the lab's testbed
# and scenarios), the session over the views, the sinks that render, the
# commands' drivers, and the command line.
LAYERS = [
    ["bpf", "error", "logging"],
    ["analysis"],
    ["sys"],
    ["views", "active", "lab"],
    ["session"],
    ["sinks"],
    ["cmd"],
    ["cli", "fuzzing"],
]
VIEW_FRAMEWORK = {"view", "passive", "loader", "fine", "names", "features", "scope", "def"}

node_re = re.compile(r'^\s*"([^"]+)" \[label="([^|"]*)\|')
edge_re = re.compile(r'^\s*"([^"]+)" -> "([^"]+)" \[label="uses"')

modules = set()
items = set()
edges = []
for line in graph_lines():
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
    not_checked("check-modules: no module in the input (did cargo modules run?): module graph not checked")


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

LAYER = {top: n for n, names in enumerate(LAYERS) for top in names}


def top_of(module):
    """The top-level module (`rttscope::views::tcp` -> `views`); None for the crate root."""
    parts = module.split("::")
    return parts[1] if len(parts) > 1 else None


def view_folder(module):
    """The view's folder a module is in (`rttscope::views::tcp::attach` -> `tcp`), else None."""
    parts = module.split("::")
    if len(parts) > 2 and parts[1] == "views" and parts[2] not in VIEW_FRAMEWORK:
        return parts[2]
    return None


inline_up = []
for a, b, w in (inline_uses() if FROM_CARGO else []):
    fa, fb = view_folder(a), view_folder(b)
    ta, tb = top_of(a), top_of(b)
    if fb is not None and ta == "views" and a != "rttscope::views" and fa != fb:
        graph[a].add(b)  # a view naming another view: checked below as a use
        why.setdefault((a, b), w)
    elif ta in LAYER and tb in LAYER and ta != tb and LAYER[tb] >= LAYER[ta]:
        inline_up.append(f"  {a} -> {b}   ({w})")

arrows, unlayered, outside_uses = [], set(), {}
for a in sorted(graph):
    for b in sorted(graph[a]):
        ta, tb = top_of(a), top_of(b)
        for t in (ta, tb):
            if t is not None and t not in LAYER:
                unlayered.add(t)
        if ta is None or tb is None or ta not in LAYER or tb not in LAYER:
            continue
        if ta != tb and LAYER[tb] >= LAYER[ta]:
            way = "sideways" if LAYER[tb] == LAYER[ta] else "up"
            arrows.append(f"  {a} -> {b}   ({way}: {ta} is layer {LAYER[ta]}, {tb} layer {LAYER[tb]}; {why[(a, b)]})")
        fa, fb = view_folder(a), view_folder(b)
        if fb is not None and ta == "views" and a != "rttscope::views" and fa != fb:
            where = f"the view {fa}" if fa else "the views' framework"
            arrows.append(f"  {a} -> {b}   ({where} uses the view {fb}'s folder; {why[(a, b)]}; "
                          f"if views::{fb} is framework, not a view, add it to VIEW_FRAMEWORK in this script)")
        if fb is not None and ta != "views":
            outside_uses.setdefault(f"{a} -> {b}", why[(a, b)])

n_edges = sum(len(s) for s in graph.values())
ok = True
for t in sorted(unlayered):
    print(f"top-level module {t} is in no layer: add it to LAYERS in scripts/check-modules.py")
    ok = False
if arrows:
    print("arrows back up the layers (or between views):")
    print("\n".join(arrows))
    ok = False
for comp in sccs:
    ok = False
    print("cycle among: " + ", ".join(comp))
    for a in comp:
        for b in sorted(graph[a]):
            if b in comp:
                print(f"  {a} -> {b}   ({why[(a, b)]})")
if inline_up:
    print(f"check-modules: {len(inline_up)} inline paths up the layers (not failed):")
    print("\n".join(inline_up))
print(f"check-modules: {len(outside_uses)} module uses of a view's folder from outside views (not failed):")
for k in sorted(outside_uses):
    print(f"  {k}")
print(f"check-modules: {len(modules)} modules, {n_edges} module-to-module uses, "
      f"{len(sccs)} cycles, {len(arrows)} arrows back up the layers or between views")
sys.exit(0 if ok else 1)
