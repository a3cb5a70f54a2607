#!/usr/bin/env python3
"""`make lint`: no import circle inside a crate.

A file imports another when its code names a path into that file's module: a `use` item
(re-exports included: `pub use` is an import too), or a path in code (`crate::a::b::f()`,
`super::x`, a child module's `m::f`). The path leads to the file of the deepest module it
names: `use crate::table::Layout` imports table/mod.rs even where mod.rs re-exports Layout
from table/buckets.rs, so inside a crate items are imported from the file that defines them.
A circle is a set of files each reaching the others through such imports; the script prints
every circle with the imports that tie it and exits 1. A circle is cut by moving what both
files need below both.

Comments, strings, unit tests (`#[cfg(test)] mod tests { ... }`: a test may exercise a file
through the files above it) and paths built from macro variables (`$file::X`) are not read; a
`mod` declaration is not an import. Every package of the workspace is read: its library, binaries,
integration tests, examples and benches, each a crate of its own.

    scripts/import-circles.py [PACKAGE_DIR...]   (default: the workspace's members)
"""

import os
import re
import sys
import tomllib
from pathlib import Path

TOKEN = re.compile(r"\$?[A-Za-z_][A-Za-z0-9_]*|::|.", re.S)
IDENT = re.compile(r"\$?[A-Za-z_]")
RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"'(\\.[^']*|[^\\'])'")


def blank(src):
    """`src` with comments, string and character literals left out."""
    out, i, n = [], 0, len(src)
    while i < n:
        word_before = i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_")
        if src.startswith("//", i):
            i = src.find("\n", i) if "\n" in src[i:] else n
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif not word_before and (m := RAW_STRING.match(src, i)):
            end = src.find('"' + m.group(1), m.end())
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""')
        elif src[i] == '"' or (not word_before and src.startswith('b"', i)):
            i += 2 if src[i] == "b" else 1
            while i < n and src[i] != '"':
                i += 2 if src[i] == "\\" else 1
            i += 1
            out.append('""')
        elif src[i] == "'" and (m := CHAR.match(src, i)):
            i = m.end()
            out.append("' '")
        else:
            out.append(src[i])
            i += 1
    # `pub(in crate::a)` names where an item is visible, not what it imports.
    return re.sub(r"pub\s*\(\s*in\s+[^)]*\)", "pub", "".join(out))


def tokens(path):
    """The tokens of a file, its `#[cfg(test)] mod ... { ... }` blocks left out."""
    toks = [t for t in TOKEN.findall(blank(path.read_text())) if not t.isspace()]
    out, i = [], 0
    while i < len(toks):
        if toks[i : i + 7] == ["#", "[", "cfg", "(", "test", ")", "]"]:
            j = i + 7
            while j < len(toks) and toks[j] not in ("{", ";"):
                j += 1
            if j < len(toks) and toks[j] == "{" and "mod" in toks[i + 7 : j]:
                depth = 0
                while j < len(toks):
                    depth += {"{": 1, "}": -1}.get(toks[j], 0)
                    j += 1
                    if depth == 0:
                        break
                i = j
                continue
        out.append(toks[i])
        i += 1
    return out


class Module:
    """A module of a crate: its file (an inline module's is its parent's) and children."""

    def __init__(self, name, file, parent):
        self.name, self.file, self.parent = name, file, parent
        self.children = {}

    def path(self):
        names, m = [], self
        while m.parent:
            names.append(m.name)
            m = m.parent
        return names[::-1]


def child_file(file, name, is_root):
    folder = file.parent if is_root or file.name == "mod.rs" else file.parent / file.stem
    for candidate in (folder / f"{name}.rs", folder / name / "mod.rs"):
        if candidate.exists():
            return candidate
    return None


def scopes(module, toks):
    """(module in scope, index) of each token of a file whose module is `module`."""
    stack, opened, depth = [module], [], 0
    for i, t in enumerate(toks):
        yield stack[-1], i
        if t == "{":
            if i >= 2 and toks[i - 2] == "mod" and toks[i - 1] in stack[-1].children:
                stack.append(stack[-1].children[toks[i - 1]])
                opened.append(depth)
            depth += 1
        elif t == "}":
            depth -= 1
            if opened and opened[-1] == depth:
                opened.pop()
                stack.pop()


class Crate:
    def __init__(self, root):
        self.root = Module("crate", root, None)
        self.files = {}  # file -> (module, tokens)
        self.load(self.root, root, True)

    def load(self, module, file, is_root):
        toks = tokens(file)
        self.files[file] = (module, toks)
        for scope, i in scopes(module, toks):
            if toks[i] != "mod" or i + 2 >= len(toks) or not IDENT.match(toks[i + 1]):
                continue
            name = toks[i + 1]
            if toks[i + 2] == "{":
                scope.children[name] = Module(name, file, scope)
            elif toks[i + 2] == ";" and scope is module:
                found = child_file(file, name, is_root)
                if found:
                    child = Module(name, found, scope)
                    scope.children[name] = child
                    self.load(child, found, False)

    def target(self, scope, segments):
        """The file of the deepest module `segments` names from `scope`, or None."""
        if any(s.startswith("$") and s != "$crate" for s in segments):
            return None
        first = segments[0]
        if first in ("crate", "$crate"):
            names = segments[1:]
        elif first in ("self", "super"):
            names, rest = scope.path(), segments
            while rest and rest[0] in ("self", "super"):
                names = names[:-1] if rest[0] == "super" else names
                rest = rest[1:]
            names = names + rest
        elif first in scope.children:
            names = scope.path() + segments
        else:
            return None
        node = self.root
        for name in names:
            if name not in node.children:
                break
            node = node.children[name]
        return node.file

    def imports(self):
        """file -> {imported file: the first path that imports it}."""
        edges = {}
        for file, (module, toks) in self.files.items():
            mine = edges.setdefault(file, {})
            skip_to = 0
            for scope, i in scopes(module, toks):
                if i < skip_to:
                    continue
                if toks[i] == "use":
                    paths, skip_to = use_tree(toks, i + 1, [])
                elif IDENT.match(toks[i]) and toks[i + 1 : i + 2] == ["::"] and toks[i - 1 : i] != ["::"]:
                    path, j = [toks[i]], i + 1
                    while j + 1 < len(toks) and toks[j] == "::" and IDENT.match(toks[j + 1]):
                        path.append(toks[j + 1])
                        j += 2
                    paths, skip_to = [path], j
                else:
                    continue
                for path in paths:
                    found = self.target(scope, path)
                    if found and found != file:
                        mine.setdefault(found, "::".join(path))
        return edges


def use_tree(toks, i, prefix):
    """The paths of the `use` tree at `toks[i]` under `prefix`, and the index after it."""
    path = list(prefix)
    while i < len(toks):
        t = toks[i]
        if t == "{":
            paths, i = [], i + 1
            while toks[i] != "}":
                sub, i = use_tree(toks, i, path)
                paths += sub
                i += toks[i] == ","
            return paths or [path], i + 1
        if t == "::":
            i += 1
        elif t == "as":
            return [path], i + 2
        elif t != "self" and IDENT.match(t):
            path.append(t)
            i += 1
        elif t == "self":
            i += 1
        else:  # `*`, `,`, `}`, `;`
            return [path], i + (t == "*")
    return [path], i


def circles(edges):
    """The strongly connected sets of more than one file (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges.get(nxt, ()))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        found.append(sorted(members))
    return found


def crate_roots(package):
    roots = [package / "src/lib.rs", package / "src/main.rs"]
    for pattern in ("src/bin/*.rs", "src/bin/*/main.rs", "tests/*.rs", "examples/*.rs", "benches/*.rs"):
        roots += sorted(package.glob(pattern))
    manifest = tomllib.loads((package / "Cargo.toml").read_text())
    for kind in ("bin", "test", "example", "bench"):
        roots += [package / t["path"] for t in manifest.get(kind, []) if "path" in t]
    return [r for r in dict.fromkeys(roots) if r.exists()]


def rel(path):
    return os.path.relpath(path)


def check(packages, out=sys.stdout):
    """Prints every circle of the crates in `packages`; returns how many there are."""
    count = 0
    for package in packages:
        for root in crate_roots(package):
            edges = Crate(root).imports()
            for members in circles(edges):
                count += 1
                print(f"{rel(root)}: an import circle of {len(members)} files:", file=out)
                inside = set(members)
                for file in members:
                    for target, path in sorted(edges[file].items()):
                        if target in inside:
                            print(f"  {rel(file)} -> {rel(target)} ({path})", file=out)
    return count


def main():
    here = Path(__file__).resolve().parent.parent
    if len(sys.argv) > 1:
        packages = [Path(p) for p in sys.argv[1:]]
    else:
        workspace = tomllib.loads((here / "Cargo.toml").read_text())["workspace"]
        packages = [here / m for m in workspace["members"]]
    count = check(packages)
    if count:
        print(f"import-circles: {count} import circle(s): import each item from the file that "
              "defines it, and move what two files share below both", file=sys.stderr)
        sys.exit(1)
    print("import-circles: no import circle", file=sys.stderr)


if __name__ == "__main__":
    main()
