#!/usr/bin/python3
"""The largest functions of the C and CUDA sources: lines from the line that names the function to
its closing brace, largest first.

    scripts/largest-functions.py [--top N] [ROOT]     (default: 10, the repository this is in)

A function is a definition that starts at column 0 (what the project's style writes) and whose
body is a balanced { } block; braces inside strings, character literals and comments do not
count. Files are the git-tracked and untracked-not-ignored *.c, *.h, *.cu, *.cuh (every such file
below ROOT outside a git checkout), without tests/fixtures and build folders."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from repofiles import repo_files  # noqa: E402

top = 10
args = sys.argv[1:]
if args[:1] == ["--top"]:
    top = int(args[1])
    args = args[2:]
root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
EXT = (".c", ".h", ".cu", ".cuh")


def sources():
    return [f for f in repo_files(root) if f.endswith(EXT) and not f.startswith("tests/fixtures/")]


def strip(src):
    """src with comments, strings and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif src[i] in "\"'":
            q, j = src[i], i + 1
            while j < n and src[j] != q and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


NAME = re.compile(r"([A-Za-z_]\w*)\s*\(")
SKIP_WORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined", "__attribute__",
              "__declspec", "__launch_bounds__", "alignof", "_Alignof", "typeof", "__typeof__"}


def functions(rel):
    src = strip(open(os.path.join(root, rel), encoding="utf-8", errors="replace").read())
    lines = src.split("\n")
    found = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line or line[0] in " \t#}{":
            i += 1
            continue
        # the header runs until the first '{' or ';' at depth 0 of parentheses
        start, text, j = i, "", i
        while j < len(lines) and j < i + 12:
            text += lines[j] + "\n"
            k = next((p for p, ch in enumerate(text) if ch in "{;"), -1)
            if k >= 0:
                break
            j += 1
        k = next((p for p, ch in enumerate(text) if ch in "{;="), -1)
        if k < 0 or text[k] != "{":
            i += 1
            continue
        head = text[:k]
        names = [m.group(1) for m in NAME.finditer(head) if m.group(1) not in SKIP_WORDS]
        if not names or re.match(r"\s*(struct|union|enum|typedef)\b[^(]*$", head):
            i += 1
            continue
        # the first call-like name of the header (attributes are skipped: SKIP_WORDS)
        name = names[0]
        depth, end = 0, None
        pos_line = start + head.count("\n")
        for li in range(pos_line, len(lines)):
            seg = lines[li]
            if li == pos_line:
                seg = seg[len(head.split("\n")[-1]):]
            for ch in seg:
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        end = li
                        break
            if end is not None:
                break
        if end is None:
            i += 1
            continue
        # the function's first line: the one that names it
        name_line = start + head[:head.find(name)].count("\n")
        found.append((end - name_line + 1, name, rel, name_line + 1))
        i = end + 1
    return found


def main():
    allf = []
    for rel in sources():
        allf += functions(rel)
    allf.sort(key=lambda x: (-x[0], x[2], x[3]))
    print("| Lines | Function | Location |")
    print("|---|---|---|")
    for n, name, rel, line in allf[:top]:
        print(f"| {n} | `{name}` | `{rel}:{line}` |")
    print(f"({len(allf)} functions in {len(sources())} files)")


if __name__ == "__main__":
    main()
