#!/usr/bin/env python3
"""Rust functions longer than a limit, outside tests.

Usage: scripts/check-fn-length.py [--max N] [--warn N] [PATH...]
(default PATH userspace/src, --max 100, --warn 60).

A function's length is counted from the line of its `fn` keyword to the line
of its closing brace, both included (attributes and doc comments not counted).
Comments, strings, raw strings and char literals are blanked before the braces
are matched, so a brace in a string does not count. Left out as tests: files
under a `tests/` directory, `#[cfg(test)]` items (a `mod tests { ... }` block)
and `#[test]` functions. A function nested in another is counted on its own
and inside its parent.

Prints every function over --warn (marked `!` when over --max), longest first,
and exits 1 when any is over --max.
"""
import argparse
import os
import re
import sys

IDENT = re.compile(r"[A-Za-z0-9_]")


def blank(src):
    """The source with comments and literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(src)

    def keep_lines(s):
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(keep_lines(src[i:j]))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_lines(src[i:j]))
            i = j
        elif c in "rb" and (i == 0 or not IDENT.match(src[i - 1])):
            m = re.compile(r'(br|rb|r)(#*)"').match(src, i)
            if m:
                close = '"' + m.group(2)
                j = src.find(close, m.end())
                j = n if j < 0 else j + len(close)
                out.append(keep_lines(src[i:j]))
                i = j
            elif src.startswith('b"', i) or src.startswith("b'", i):
                out.append(" ")
                i += 1
            else:
                out.append(c)
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
            out.append(keep_lines(src[i:j]))
            i = j
        elif c == "'":
            if i + 1 < n and src[i + 1] == "\\":
                j = src.find("'", i + 3 if src[i + 2 : i + 3] == "'" else i + 2)
                j = n if j < 0 else j + 1
                out.append(keep_lines(src[i:j]))
                i = j
            elif i + 2 < n and src[i + 2] == "'":
                out.append("   ")
                i += 3
            else:  # a lifetime or a label
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(code, open_at):
    """Index of the brace closing the one at open_at."""
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def body_start(code, i):
    """Index of the `{` opening the item whose header starts at i, or None (a `;`)."""
    depth = 0
    for j in range(i, len(code)):
        ch = code[j]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and ch == ";":
            return None
        elif depth == 0 and ch == "{":
            return j
    return None


ATTR_TEST = re.compile(r"#\[\s*(cfg\s*\(\s*test\s*\)|test|tokio::test[^\]]*)\s*\]")
FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def test_ranges(code):
    """Character ranges of items marked #[cfg(test)] / #[test]."""
    ranges = []
    for m in ATTR_TEST.finditer(code):
        start = body_start(code, m.end())
        if start is not None:
            ranges.append((m.start(), matching(code, start)))
    return ranges


def functions(path):
    with open(path, encoding="utf-8") as f:
        code = blank(f.read())
    tests = test_ranges(code)
    line_at = [0] * (len(code) + 1)
    line = 1
    for k, ch in enumerate(code):
        line_at[k] = line
        if ch == "\n":
            line += 1
    line_at[len(code)] = line
    for m in FN.finditer(code):
        if any(a <= m.start() <= b for a, b in tests):
            continue
        start = body_start(code, m.end())
        if start is None:
            continue
        end = matching(code, start)
        first, last = line_at[m.start()], line_at[end]
        yield m.group(1), first, last - first + 1


def rust_files(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
            continue
        for root, dirs, files in os.walk(p):
            dirs[:] = sorted(d for d in dirs if d not in ("tests", "target"))
            for name in sorted(files):
                if name.endswith(".rs"):
                    yield os.path.join(root, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=100)
    ap.add_argument("--warn", type=int, default=60)
    ap.add_argument("paths", nargs="*", default=["userspace/src"])
    args = ap.parse_args()
    found = []
    for path in rust_files(args.paths):
        for name, line, length in functions(path):
            if length > args.warn:
                found.append((length, path, line, name))
    found.sort(key=lambda t: (-t[0], t[1], t[2]))
    over = 0
    for length, path, line, name in found:
        mark = "!" if length > args.max else " "
        over += length > args.max
        print(f"{mark} {length:4} {path}:{line} {name}")
    print(
        f"check-fn-length: {over} functions over {args.max} lines, "
        f"{len(found) - over} over {args.warn} (tests left out)"
    )
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
