#!/usr/bin/env python3
"""Module import graph of a crate's src/: an edge A -> B when A's code names an item of
module B (`crate::b::...`, `super::...`, `self::child::...`, `$crate::b`), comments and
`mod` declarations excluded. Prints edges and any cycle (strongly connected components)."""
import os, re, sys

def modname(root, path):
    rel = os.path.relpath(path, root)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts) or "crate"

def strip_comments(s):
    """The code of a Rust file with comments removed and string/char literals emptied (a
    small lexer: block and line comments, plain, byte and raw strings, char literals; a
    lifetime `'a` is left alone)."""
    out, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        if s.startswith("//", i):
            j = s.find("\n", i)
            i = n if j < 0 else j
        elif s.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if s.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif s.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and (i == 0 or not (s[i - 1].isalnum() or s[i - 1] == "_")) and re.match(r'r#*"', s[i:]):
            m = re.match(r'r(#*)"', s[i:])
            end = s.find('"' + m.group(1), i + m.end())
            out.append('""')
            i = n if end < 0 else end + 1 + len(m.group(1))
        elif c == '"':
            i += 1
            while i < n and s[i] != '"':
                i += 2 if s[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'" and re.match(r"'(\\.[^']*|[^'\\])'", s[i:]):
            m = re.match(r"'(\\.[^']*|[^'\\])'", s[i:])
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)

def expand_groups(s):
    # crate::{a, b::c} -> crate::a crate::b::c (one level deep is enough here)
    out = []
    for m in re.finditer(r"\b(crate|super(?:::super)*|self|\$crate)((?:::\w+)*)::\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", s):
        head = m.group(1) + m.group(2)
        for part in re.split(r",(?![^{]*\})", m.group(3)):
            part = part.strip()
            if part:
                out.append(head + "::" + part.split("::{")[0])
    return out

def refs(s):
    r = re.findall(r"\b(?:\$crate|crate|super(?:::super)*|self)(?:::\w+)+", s)
    return r + expand_groups(s)

def resolve(mod, ref, mods):
    parts = ref.split("::")
    cur = [] if mod == "crate" else mod.split("::")
    if parts[0] in ("crate", "$crate"):
        base = []
        parts = parts[1:]
    elif parts[0] == "self":
        base = list(cur) if not is_file_mod(mod) else list(cur)
        parts = parts[1:]
    else:
        base = list(cur)
        while parts and parts[0] == "super":
            base = base[:-1]
            parts = parts[1:]
    # longest prefix that is a module
    best = "::".join(base) or "crate"
    for i in range(len(parts)):
        cand = "::".join(base + parts[: i + 1])
        if cand in mods:
            best = cand
        else:
            break
    return best

def is_file_mod(m):
    return True

def main(root):
    files = []
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith(".rs"):
                files.append(os.path.join(d, f))
    mods = {}
    texts = {}
    for f in files:
        m = modname(root, f)
        mods[m] = f
        text = strip_comments(open(f).read())
        # inline modules (`mod tests { ... }`) are modules of their own
        while True:
            mm = re.search(r"\bmod (\w+) \{", text)
            if not mm:
                break
            i = mm.end(); depth = 1
            while depth and i < len(text):
                c = text[i]
                depth += (c == "{") - (c == "}")
                i += 1
            child = (m + "::" if m != "crate" else "") + mm.group(1)
            mods[child] = f
            texts[child] = text[mm.end():i - 1]
            text = text[:mm.start()] + text[i:]
        texts[m] = text
    # inline `mod tests`/`mod avx2 { ... }` count as part of their file
    edges = set()
    for m, f in mods.items():
        s = texts[m]
        # drop #[cfg(test)] mod tests { ... } blocks? keep: test code imports count too
        for r in refs(s):
            t = resolve(m, r, mods)
            if t != m and t != "crate":
                edges.add((m, t))
            elif t == "crate" and m != "crate":
                pass
    # bare paths to a child module (`avx2::run(..)`, `use avx2::x`)
    for m in list(mods):
        prefix = "" if m == "crate" else m + "::"
        for c in mods:
            if c.startswith(prefix) and c != m and "::" not in c[len(prefix):]:
                name = c[len(prefix):]
                if re.search(r"(?<![:\w])" + name + r"::", texts[m]):
                    edges.add((m, c))
    names = sorted(mods)
    print("modules:", len(names))
    for m in names:
        outs = sorted(t for (a, t) in edges if a == m)
        print(f"  {m} -> {', '.join(outs) if outs else '-'}")
    # Tarjan SCC
    idx, low, on, st, res, counter = {}, {}, set(), [], [], [0]
    adj = {m: [t for (a, t) in edges if a == m] for m in names}
    sys.setrecursionlimit(10000)
    def sc(v):
        idx[v] = low[v] = counter[0]; counter[0] += 1; st.append(v); on.add(v)
        for w in adj.get(v, []):
            if w not in idx:
                sc(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: res.append(sorted(comp))
    for v in names:
        if v not in idx: sc(v)
    print("cycles:", res if res else "none")

main(sys.argv[1])
