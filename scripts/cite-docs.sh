#!/bin/bash
# Points the tree's citations at the documents it ships: `spec §N` becomes `docs/model.md §N`
# (docs/model.md keeps the specification's section numbers) and a bare `design.md` becomes
# `docs/design.md`. Rewrites comments only — C/CUDA/protobuf `//` and `/* */` comments, Python
# comments and docstrings, `#` comments of shell, meson and config files — and the text of
# Markdown files outside docs/. String literals are left alone (they are messages users see and
# tests assert); the ones that cite the specification are listed at the end, for their owners.
# Idempotent: a second run changes nothing.
#
#   scripts/cite-docs.sh [--dry-run] [--strings] [ROOT]
#     --dry-run   say what would change, change nothing (exit 1 if anything would)
#     --strings   rewrite C string literals too
# Prints one line per changed file and the total number of replacements.
set -euo pipefail
X4_SCRIPTS=$(cd "$(dirname "$0")" && pwd) exec python3 - "$@" <<'PYEOF'
import io
import os
import re
import sys
import tokenize

sys.path.insert(0, os.environ["X4_SCRIPTS"])
from repofiles import repo_files  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
dry = "--dry-run" in sys.argv
strings_too = "--strings" in sys.argv
root = os.path.abspath(args[0] if args else os.path.join(os.getcwd()))

SPEC = re.compile(r"\bspec §")
DESIGN = re.compile(r"(?<![\w/.\[-])design\.md\b")
C_LIKE = (".c", ".h", ".cu", ".cuh", ".proto")
HASH = (".sh", ".conf", ".build", ".service", ".socket", ".options")
SKIP = ("docs/", "tests/fixtures/chat-templates/", "tests/compat/node_modules/", "node_modules/",
        "scripts/cite-docs.sh", "tests/docs/check_docs.py")


RULER = re.compile(r"-{8,}")


def rewrite(text):
    """The replacements in text, and how many. A line that grows and holds a ruler of dashes
    (`/* ---- name ----- */`) gives the growth back from the ruler, so rulers keep their width."""
    out, n = [], 0
    for line in text.splitlines(keepends=True):
        new, k = SPEC.subn("docs/model.md §", line)
        new, k2 = DESIGN.subn("docs/design.md", new)
        grow = len(new) - len(line)
        if grow > 0:
            m = None
            for m in RULER.finditer(new):
                pass
            if m and len(m.group(0)) - grow >= 4:
                new = new[:m.start()] + "-" * (len(m.group(0)) - grow) + new[m.end():]
        out.append(new)
        n += k + k2
    return "".join(out), n


def c_like(src, rel, literals):
    """Rewrite inside comments (and string literals with --strings) of C-family source."""
    out, i, n, N = [], 0, 0, len(src)
    while i < N:
        c = src[i]
        if src.startswith("//", i) or src.startswith("/*", i):
            end = src.find("\n", i) if src[i + 1] == "/" else src.find("*/", i + 2)
            end = N if end < 0 else (end if src[i + 1] == "/" else end + 2)
            seg, k = rewrite(src[i:end])
            out.append(seg)
            n += k
            i = end
        elif c in "\"'":
            j = i + 1
            while j < N and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, N)
            seg = src[i:j]
            if c == '"' and (SPEC.search(seg) or DESIGN.search(seg)):
                if strings_too:
                    seg, k = rewrite(seg)
                    n += k
                else:
                    literals.append(f"{rel}:{src.count(chr(10), 0, i) + 1}: {seg.strip()[:90]}")
            out.append(seg)
            i = j
        else:
            j = i
            while j < N and src[j] not in "\"'/":
                j += 1
            if j == i:  # a lone '/'
                j = i + 1
            out.append(src[i:j])
            i = j
    return "".join(out), n


def python(src):
    """Rewrite Python comments and docstrings (string statements)."""
    edits = []
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    prev = None
    for idx, t in enumerate(toks):
        if t.type == tokenize.COMMENT:
            edits.append((t.start, t.end))
        elif t.type == tokenize.STRING:
            nxt = toks[idx + 1].type if idx + 1 < len(toks) else tokenize.NEWLINE
            if (prev is None or prev in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)) \
                    and nxt in (tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.COMMENT):
                edits.append((t.start, t.end))
        if t.type not in (tokenize.NL, tokenize.COMMENT, tokenize.ENCODING):
            prev = t.type
    lines = src.splitlines(keepends=True)
    starts = [0]
    for l in lines:
        starts.append(starts[-1] + len(l))
    n = 0
    for (sr, sc), (er, ec) in reversed(edits):
        a, b = starts[sr - 1] + sc, starts[er - 1] + ec
        seg, k = rewrite(src[a:b])
        if k:
            src = src[:a] + seg + src[b:]
            n += k
    return src, n


def hash_comments(src):
    out, n = [], 0
    for line in src.splitlines(keepends=True):
        q, cut = None, -1
        for i, ch in enumerate(line):
            if q:
                if ch == q:
                    q = None
            elif ch in "\"'":
                q = ch
            elif ch == "#":
                cut = i
                break
        if cut >= 0:
            seg, k = rewrite(line[cut:])
            line = line[:cut] + seg
            n += k
        out.append(line)
    return "".join(out), n


def files():
    return [f for f in repo_files(root) if not f.startswith(SKIP)]


total, changed, literals = 0, 0, []
for rel in files():
    path = os.path.join(root, rel)
    base = os.path.basename(rel)
    try:
        src = open(path, encoding="utf-8").read()
    except UnicodeDecodeError:
        continue
    if "spec §" not in src and "design.md" not in src:
        continue
    if rel.endswith(C_LIKE):
        new, n = c_like(src, rel, literals)
    elif rel.endswith(".py"):
        new, n = python(src)
    elif rel.endswith(".md"):
        new, n = rewrite(src)
    elif rel.endswith(HASH) or base in ("meson.build", "rules", "run"):
        new, n = hash_comments(src)
    else:
        continue
    if n:
        changed += 1
        total += n
        print(f"{rel}: {n}")
        if not dry:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
print(f"cite-docs: {total} replacements in {changed} files{' (dry run)' if dry else ''}")
if literals:
    print(f"left in {len(literals)} string literals (user-visible; --strings rewrites them):")
    for l in literals:
        print("  " + l)
sys.exit(1 if dry and total else 0)
PYEOF
