#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Differential test of x4-template against python3-jinja2 (reference.py).

diff_templates.py X4_TEMPLATE [--report] [--only NAME...]
Renders every template of tests/fixtures/chat-templates (and the built-in xing4.jinja) with every
context of tests/chat/contexts, and every snippet of snippets.txt with one context, with both
renderers. A template passes when, for every context, both give the
same bytes, or the reference raises and x4-template exits non-zero with a message. Every template
named in tests/chat/supported.txt must pass (exit 1 otherwise); --report prints every template's
status and the first difference."""
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("X4_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
TEMPLATES = os.path.join(SRC, "tests", "fixtures", "chat-templates")
CONTEXTS = os.path.join(HERE, "contexts")


def first_diff(a, b):
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), n)
    return "at byte %d: ours %r / reference %r" % (i, a[max(0, i - 40):i + 40], b[max(0, i - 40):i + 40])


STATS = {"same": 0, "both_fail": 0}


def check(x4, env, tpath, contexts):
    with open(tpath, encoding="utf-8") as f:
        text = f.read()
    problems = []
    for cpath in contexts:
        with open(cpath, encoding="utf-8") as f:
            ctx = json.load(f)
        ok, ref = reference.render(env, text, ctx)
        p = subprocess.run([x4, tpath, cpath], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        cname = os.path.basename(cpath)
        if not ok:
            if p.returncode == 0:
                problems.append("%s: reference fails (%s) but x4-template succeeded" % (cname, ref))
            elif not p.stderr.strip():
                problems.append("%s: x4-template failed without a message" % cname)
            else:
                STATS["both_fail"] += 1
            continue
        if p.returncode != 0:
            problems.append("%s: x4-template failed: %s" % (cname, p.stderr.decode(errors="replace").strip()))
        elif p.stdout != ref:
            problems.append("%s: output differs %s" % (cname, first_diff(p.stdout, ref)))
        else:
            STATS["same"] += 1
    return problems


def main():
    args = sys.argv[1:]
    if not args:
        sys.stderr.write(__doc__)
        return 2
    x4 = args.pop(0)
    report = "--report" in args
    only = args[args.index("--only") + 1:] if "--only" in args else None
    os.environ["X4_TEMPLATE_NOW"] = "2026-01-02"
    env = reference.make_env()
    contexts = sorted(glob.glob(os.path.join(CONTEXTS, "*.json")))
    with open(os.path.join(HERE, "supported.txt"), encoding="utf-8") as f:
        supported = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    templates = sorted(os.path.basename(p) for p in glob.glob(os.path.join(TEMPLATES, "*.jinja")))
    missing = [s for s in supported if s not in templates]
    if missing:
        print("supported.txt names missing templates: %s" % missing)
        return 1
    names = only if only else (templates if report else supported)
    # the built-in Xing4 template (a copy of chat_xing4_template; test-chat checks they are equal)
    if not only:
        names = names + ["xing4.jinja"]
        supported = supported + ["xing4.jinja"]
    failed = []
    passed = 0
    for name in names:
        path = os.path.join(HERE if name == "xing4.jinja" else TEMPLATES, name)
        problems = check(x4, env, path, contexts)
        if problems:
            failed.append(name)
            print("FAIL %s%s" % (name, "" if name in supported else " (not listed)"))
            for p in problems[:3]:
                print("    " + p)
        else:
            passed += 1
            if report:
                print("ok   %s" % name)
    # x4-template's contract on bad input: non-zero exit and a message naming place and construct
    cli_fail = 0
    if not only:
        with tempfile.TemporaryDirectory() as tmp:
            for text, expect in (("a\n {% call m() %}x{% endcall %}", "template:2:5: unsupported tag 'call'"),
                                 ("{{ x | xmlattr }}", "template:1:8: unsupported filter 'xmlattr'"),
                                 ("{% if %}", "template:1:7: expected an expression, got '%}'")):
                path = os.path.join(tmp, "bad.jinja")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                p = subprocess.run([x4, path, contexts[0]], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                if p.returncode == 0 or expect not in p.stderr.decode(errors="replace"):
                    cli_fail += 1
                    print("FAIL x4-template on %r: rc %d, stderr %r (expected %r)" % (text, p.returncode, p.stderr, expect))
    # semantics snippets (snippets.txt, separated by "----" lines) on one conversation
    snippet_fail = 0
    if not only:
        with open(os.path.join(HERE, "snippets.txt"), encoding="utf-8") as f:
            snippets = f.read().rstrip("\n").split("\n----\n")
        with tempfile.TemporaryDirectory() as tmp:
            for i, text in enumerate(snippets):
                path = os.path.join(tmp, "snippet-%03d.jinja" % i)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                problems = check(x4, env, path, [os.path.join(CONTEXTS, "03-multi-turn.json")])
                if problems:
                    snippet_fail += 1
                    print("FAIL snippet %d: %r" % (i, text[:100]))
                    for p in problems:
                        print("    " + p)
        print("%d of %d semantics snippets identical" % (len(snippets) - snippet_fail, len(snippets)))
    print("%d of %d templates identical on %d contexts (%d listed in supported.txt, plus the built-in xing4.jinja)"
          % (passed, len(names), len(contexts), len(supported) - (0 if only else 1)))
    print("renders compared: %d byte-identical, %d refused by both (reference raised)"
          % (STATS["same"], STATS["both_fail"]))
    return 1 if snippet_fail or cli_fail or any(n in supported for n in failed) else 0


if __name__ == "__main__":
    sys.exit(main())
