#!/usr/bin/python3
"""The repository documents itself, and its documents match the code.

Checks, over the source tree given as the one argument (default: this file's repository):
  1. every `path:function` reference in a Markdown file names a file that exists and a function
     (or macro, Python def/class, shell function, protobuf message/enum) defined in it;
  2. every repository path in backticks in a Markdown file exists (globs allowed);
  3. every relative Markdown link resolves to a file or folder inside the repository;
  4. every `docs/model.md §N` cited anywhere in the tree is a section of docs/model.md, and every
     `docs/design.md "Title"` is the start of a heading of docs/design.md;
  5. nothing in the tree refers to a path outside it (the sibling shared/ folder of the
     development setup, or its absolute location).
Prints one line per problem (file:line: what) and exits 1 if there is any."""
import glob
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
TOP = {"daemon", "kernels", "tests", "tools", "cli", "libclient", "http-bridge", "proto",
       "packaging", "scripts", "bench", "man", "docs", ".ci"}
SKIP_DIRS = ("tests/fixtures/chat-templates/", "tests/compat/node_modules/", "node_modules/")
TEXT_EXT = (".md", ".c", ".h", ".cu", ".cuh", ".py", ".sh", ".proto", ".build", ".txt", ".conf",
            ".service", ".socket", ".jinja", ".json", ".1", ".8", ".js", ".mjs", ".options")
# Written in pieces so this file does not match itself.
OUTSIDE = re.compile(r"(\.\./)+" + "shared/|/work/" + r"(shared|main|wt)\b|(?<![\w/.])" + "shared/"
                     + r"(spec|design\.md|conventions|house-review|performance-anchors|fixtures)")
# The GPU scripts may name the optional peer kit beside the checkout (never needed to run).
OUTSIDE_ALLOWED = re.compile(r"peers/")

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from repofiles import repo_files  # noqa: E402  (scripts/repofiles.py)

problems = []


def problem(path, line, what):
    problems.append(f"{path}:{line}: {what}")


def tracked_files():
    return [f for f in repo_files(ROOT) if not f.startswith(SKIP_DIRS)]


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def defines(rel, name):
    """Whether file rel defines (or, for a header, declares) name."""
    text = read(rel)
    n = re.escape(name)
    if rel.endswith(".py"):
        return re.search(rf"^\s*(def|class)\s+{n}\b", text, re.M) is not None
    if rel.endswith(".sh"):
        return re.search(rf"^\s*(function\s+)?{n}\s*\(\)", text, re.M) is not None
    if rel.endswith(".proto"):
        return re.search(rf"^\s*(message|enum|service)\s+{n}\b", text, re.M) is not None
    # C, CUDA: at the start of a line (not indented, so not a call), possibly after the return
    # type and qualifiers on the same line; or a function-like macro.
    return (re.search(rf"^(?![ \t#/*])(?:[^;{{}}()\n]*[\s*])?{n}\s*\(", text, re.M) is not None
            or re.search(rf"^#\s*define\s+{n}\(", text, re.M) is not None)


def exists(rel):
    rel = rel.rstrip("/")
    if any(c in rel for c in "*?["):
        return bool(glob.glob(os.path.join(ROOT, rel)))
    return os.path.exists(os.path.join(ROOT, rel))


REF = re.compile(r"`([A-Za-z0-9_.\-/]+\.(?:c|h|cu|cuh|py|sh|proto)):([A-Za-z_]\w*)`"
                 r"|(?<![\w/.-])([A-Za-z0-9_\-/]+/[A-Za-z0-9_.\-]+\.(?:c|h|cu|cuh|py|sh|proto)):([A-Za-z_]\w*)\b")
TICK = re.compile(r"`([^`\n]+)`")
PATHLIKE = re.compile(r"^\.?[A-Za-z0-9_-]+(/[A-Za-z0-9_.*{},\-]+)*/?$")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def check_markdown(rel):
    text = read(rel)
    external = False  # under a "Sources" heading, paths are other repositories' files
    for no, line in enumerate(text.split("\n"), 1):
        if line.startswith("#"):
            external = line.lstrip("#").strip().lower().startswith("sources")
        if external:
            continue
        for m in REF.finditer(line):
            path, fn = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            if not exists(path):
                problem(rel, no, f"{path}:{fn}: no file {path}")
            elif not defines(path, fn):
                problem(rel, no, f"{path}:{fn}: {fn} is not defined in {path}")
        for m in TICK.finditer(line):
            tok = m.group(1)
            if ":" in tok:
                tok = tok.split(":", 1)[0]
            if "/" not in tok or not PATHLIKE.match(tok) or tok.split("/", 1)[0] not in TOP:
                continue
            if "{" in tok:  # xing4.pb-c.{c,h} style: check each
                base, alts = tok.split("{", 1)
                alts, rest = alts.split("}", 1)
                cands = [base + a + rest for a in alts.split(",")]
            else:
                cands = [tok]
            if "NAME" in tok:  # a pattern (tools/x4-NAME.c), not a path
                continue
            for c in cands:
                # a program is named by its source: tools/x4-bench is built from tools/x4-bench.c
                if not exists(c) and not generated(c) and not exists(c + ".c"):
                    problem(rel, no, f"`{tok}`: no such path in the repository")
        for m in LINK.finditer(TICK.sub("", line)):  # code spans are not links
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            target = target.split("#", 1)[0]
            full = os.path.normpath(os.path.join(ROOT, os.path.dirname(rel), target))
            if not full.startswith(ROOT + os.sep) and full != ROOT:
                problem(rel, no, f"link {target}: points outside the repository")
            elif not os.path.exists(full):
                problem(rel, no, f"link {target}: no such file")


def generated(rel):
    # files the build writes (protobuf-c output) are named by docs but not in the tree
    return rel.endswith((".pb-c.c", ".pb-c.h"))


def model_sections():
    secs = set()
    p = os.path.join(ROOT, "docs", "model.md")
    if not os.path.exists(p):
        return secs
    top = None
    for line in read("docs/model.md").split("\n"):
        m = re.match(r"^#{2,4}\s+(\d+(?:\.\d+)*)[.\s]", line)
        if m:
            secs.add(m.group(1))
            top = m.group(1).split(".")[0]
        elif line.startswith("#"):
            top = None
        # an item of a section's numbered list counts too: §11.6 is pitfall 6 of §11
        m = re.match(r"^(\d+)\. ", line)
        if m and top:
            secs.add(f"{top}.{m.group(1)}")
    return secs


def design_headings():
    if not os.path.exists(os.path.join(ROOT, "docs", "design.md")):
        return []
    return [re.sub(r"^#+\s+", "", l) for l in read("docs/design.md").split("\n") if l.startswith("#")]


def check_citations(rel, text, secs, heads):
    for no, line in enumerate(text.split("\n"), 1):
        for m in re.finditer(r"docs/model\.md((?:\s*(?:§|,|/|-|–|and)\s*§?\d+(?:\.\d+)*)+)", line):
            for n in re.findall(r"§?(\d+(?:\.\d+)*)", m.group(1)):
                if n not in secs:
                    problem(rel, no, f"docs/model.md §{n}: no such section in docs/model.md")
        for m in re.finditer(r'docs/design\.md\s+"([^"]+)"', line):
            if not any(h.startswith(m.group(1)) for h in heads):
                problem(rel, no, f'docs/design.md "{m.group(1)}": no heading of docs/design.md starts so')


def main():
    files = tracked_files()
    secs, heads = model_sections(), design_headings()
    if not secs:
        problem("docs/model.md", 0, "missing, or has no numbered sections")
    if not heads:
        problem("docs/design.md", 0, "missing, or has no headings")
    for rel in files:
        if not rel.endswith(TEXT_EXT) and os.path.basename(rel) not in ("README", "rules", "run"):
            continue
        if rel.endswith(".md"):
            check_markdown(rel)
        if rel in ("tests/docs/check_docs.py", "scripts/cite-docs.sh"):  # they name the patterns
            continue
        text = read(rel)
        check_citations(rel, text, secs, heads)
        for no, line in enumerate(text.split("\n"), 1):
            if OUTSIDE.search(line) and not (rel.startswith("tests/gpu/") and OUTSIDE_ALLOWED.search(line)):
                problem(rel, no, "refers to a path outside the repository: " + line.strip()[:100])
    # the test programs are listed in meson, not globbed: none may be left out
    for folder, prefix in (("tests/unit", "test-"), ("tests/fuzz", "fuzz-")):
        listed = read(folder + "/meson.build")
        for rel in files:
            base = os.path.basename(rel)
            if os.path.dirname(rel) == folder and base.startswith(prefix) and base.endswith(".c"):
                if "'" + base[:-2] + "'" not in listed:
                    problem(folder + "/meson.build", 0, base + " is not in the list: it would never build or run")
    for p in problems:
        print(p)
    print(f"docs: {len(files)} files checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
