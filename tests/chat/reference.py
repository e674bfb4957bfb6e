#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Reference chat-template renderer: Debian's python3-jinja2 set up the way Hugging Face
transformers renders tokenizer.chat_template (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, a `generation` block extension that renders its body, tojson =
json.dumps(ensure_ascii=False), raise_exception, strftime_now). strftime_now uses the date in
X4_TEMPLATE_NOW (YYYY-MM-DD) when set, as x4-template does.

Usage: reference.py TEMPLATE CONTEXT.json  -> rendering on stdout; exit 1 with the error."""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox


class GenerationBlock(jinja2.ext.Extension):
    """transformers' AssistantTracker without mask tracking: {% generation %} renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return body


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    fixed = os.environ.get("X4_TEMPLATE_NOW")
    if fixed:
        now = datetime.datetime.strptime(fixed[:10], "%Y-%m-%d")
    else:
        now = datetime.datetime.now()
    return now.strftime(format)


def make_env():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, template_text, context):
    """Returns (True, bytes) or (False, error text)."""
    try:
        t = env.from_string(template_text)
        return True, t.render(**context).encode("utf-8")
    except Exception as e:  # any failure of the reference counts as "must fail" for us
        return False, "%s: %s" % (type(e).__name__, e)


def main():
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        text = f.read()
    with open(sys.argv[2], encoding="utf-8") as f:
        ctx = json.load(f)
    ok, out = render(make_env(), text, ctx)
    if not ok:
        sys.stderr.write(out + "\n")
        return 1
    sys.stdout.buffer.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
