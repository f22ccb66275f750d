#!/usr/bin/env python3
"""Functions outside a view's folder that name a passive view (issue 24).

Usage: scripts/check-view-names.py [--max N] [--list]

A view should be named outside `userspace/src/views/<view>/` only in the
registry (`views/mod.rs`, and the list of the views' names below the views,
`analysis/view_kind.rs`, which records key their columns by): every other place that says "sampler" or "tcp view" is a place a new
view has to touch. This counts, in `userspace/src` outside `views/` and
outside tests (as scripts/check-fn-length.py finds functions and tests; and the fuzz
harnesses, fuzzing.rs, compiled only for tests and the fuzz crate), the
functions whose code or labels name a view:

  code (comments and string literals left out):
    sampler: the word sampler, any case (SamplerView, read_sampler, ViewKind::Sampler);
    tcp:     TcpView, tcp_view, views::tcp, View(Kind)::Tcp;
  labels: a string literal of at most three words that names the view, any case
    ("sampler", "sampler server", "SMP_SRV" is not: write the name; "tcp", "tcp client",
    "TCP_CLI", not "TCP_RR" or "tcp-rr", netperf's test the probe runs).

A sentence (a string literal of four words or more: a note, a HELP text, an explanation
that says what a view saw) is content, not plumbing: a new view touches no sentence, so
it is not counted. A label that spells a view's name and means something else in one function
(the IP protocol "tcp") is left out there only, by NOT_A_VIEW, which says why and which --list
prints. Each function is listed with the names it uses (--list).

A function nested in another counts on its own and inside its parent. Prints
the count per file (--list: each function) and the total; exits 1 when the
total is over --max (the suite's ceiling: it may only go down).
"""
import argparse
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("fnlen", os.path.join(HERE, "check-fn-length.py"))
fnlen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fnlen)

# The registry's part outside views/ (the names, below the views: scripts/check-modules.py's layers).
REGISTRY = {os.path.join("analysis", "view_kind.rs")}
# Test code outside `mod tests`: the fuzz harnesses (lib.rs declares the module under
# `#[cfg(any(test, feature = "fuzzing"))]`; the unit tests and the fuzz/ crate run them). They call
# every parser of files, flags and packets, a view's own among them, as a test would.
HARNESSES = {"fuzzing.rs"}

CODE = {
    "sampler": re.compile(r"sampler", re.I),
    "tcp": re.compile(r"TcpView|tcp_view|views::tcp\b|View(Kind)?::Tcp\b"),
}
LABEL = {
    "sampler": re.compile(r"(?<![A-Za-z])sampler(?![A-Za-z])", re.I),
    # the view's name, alone or with a side, or its short column labels (not "TCP_RR",
    # "tcp-rr": netperf's test, the probe's)
    "tcp": re.compile(r"^\s*(tcp( (client|server))?|TCP_(CLI|SRV))\s*$", re.I),
}
# Labels that spell a view's name and mean something else, by (file, function): the literals
# left out there, and why. Listed by --list; a literal not in its set still counts.
NOT_A_VIEW = {
    (os.path.join("sinks", "prometheus", "labels.rs"), "proto_label"): (
        {"tcp"},
        "the flow's IP protocol (the `proto` label: tcp, icmp, icmpv6), not the TCP view",
    ),
    (os.path.join("analysis", "peers.rs"), "tcp_ports"): (
        {"TCP"},
        "a Kubernetes port's protocol (`TCP`, `UDP`, `SCTP`), not the TCP view",
    ),
}
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S)
WORD = re.compile(r"[A-Za-z0-9]+")


def names_in(text, not_views=frozenset()):
    """The views a function's text names in its code or in its labels (`not_views`: literals
    that are not a view's name there)."""
    code = fnlen.blank(text)
    named = {v for v, rx in CODE.items() if rx.search(code)}
    # the literals: where blank() blanked a string (a `"` starts it in the text)
    for m in STRING.finditer(text):
        if code[m.start()] != " ":
            continue  # not a literal's start (inside a comment or a char)
        lit = m.group(1)
        if len(WORD.findall(lit)) > 3 or lit in not_views:
            continue
        named |= {v for v, rx in LABEL.items() if rx.search(lit)}
    return sorted(named)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=None)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--root", default=os.path.join(HERE, "..", "userspace", "src"))
    args = ap.parse_args()
    root = os.path.normpath(args.root)
    per_file = {}
    total = 0
    skipped = []
    paths = sorted(fnlen.rust_files([root]))
    # files their parent declares with `#[cfg(test)] mod NAME;` are all test code
    test_files = set()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            test_files.update(fnlen.test_module_files(path, f.read()))
    for path in paths:
        rel = os.path.relpath(path, root)
        if rel.startswith("views" + os.sep) or rel in REGISTRY or rel in HARNESSES:
            continue
        if os.path.normpath(path) in test_files:
            continue
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for name, first, length in fnlen.functions(path):
            text = "\n".join(lines[first - 1:first - 1 + length])
            not_views, why = NOT_A_VIEW.get((rel, name), (frozenset(), None))
            named = names_in(text, not_views)
            if why and names_in(text) != named:
                skipped.append(f"{rel}:{first} {name}: {', '.join(sorted(not_views))}: {why}")
            if named:
                per_file.setdefault(rel, []).append((first, name, named))
                total += 1
    for rel, fns in sorted(per_file.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"{len(fns):4} {rel}")
        if args.list:
            for first, name, named in fns:
                print(f"       {rel}:{first} {name} ({', '.join(named)})")
    if args.list:
        for line in skipped:
            print(f"  not counted: {line}")
    print(f"check-view-names: {total} functions in {len(per_file)} files outside views/ name a view")
    if args.max is not None and total > args.max:
        print(f"check-view-names: over the ceiling of {args.max} (issue 24: views plug in)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
