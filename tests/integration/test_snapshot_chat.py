# SPDX-License-Identifier: MIT
"""Chat snapshots are conversation prefixes (proto/README.md "snapshot", man x4ctl): a snapshot
made from chat messages is the template's rendering of them without the generation prompt, and a
chat request on it is rendered once, as the snapshot's messages followed by its own, so the model
sees one BOS and one system turn, exactly the prompt of the same conversation sent without the
snapshot, with the snapshot's tokens taken from its cache. Raw (text / token) snapshots keep
prepending their tokens, and so do snapshot files written before chat snapshots existed.

The fixture's own template ignores system messages, so these daemons serve a copy whose template
renders the BOS, a system turn, user and assistant turns (gguf_retemplate.py)."""
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import x4wire as w
from conftest import FIXTURES, Daemon

SYSTEM = "You are a terse assistant."
BOS = "<_start>"  # the fixture's BOS piece (id 1), as the template writes it
PREFIX_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}<_system>{{ m.content }}"
                   "{% elif m.role == 'user' %}<_user>{{ m.content }}{% elif m.role == 'assistant' %}"
                   "<_bot></think>{{ m.content }}<_end>\n{% endif %}{% endfor %}"
                   "{% if add_generation_prompt %}<_bot><think>\n{% endif %}")
# renders a system message that ends the conversation differently from one that is followed by
# more: the rendering of the snapshot's messages is then not the start of a longer conversation's
UNSTABLE_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}<_system>{{ m.content }}"
                     "{% if loop.last %} (alone){% endif %}{% elif m.role == 'user' %}<_user>{{ m.content }}"
                     "{% endif %}{% endfor %}{% if add_generation_prompt %}<_bot><think>\n{% endif %}")
GEN = ("--temperature", "0", "--max-tokens", "6", "--ignore-eos")


def model_with(tmp: Path, template: str) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "t.jinja").write_text(template)
    subprocess.run([sys.executable, str(Path(__file__).parent / "gguf_retemplate.py"),
                    str(FIXTURES / "xing4-tiny-a" / "model.gguf"), str(tmp / "model.gguf"),
                    str(tmp / "t.jinja")], check=True)
    shutil.copy(FIXTURES / "xing4-tiny-a" / "config.json", tmp)
    return tmp / "model.gguf"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("snapchat")
    d = Daemon(tmp / "d", args=("--model", str(model_with(tmp / "m", PREFIX_TEMPLATE))))
    yield d
    d.close()


def gen_json(d, *args):
    r = d.x4ctl("--json", "generate", *args, stdin=subprocess.DEVNULL)
    # 7: the 6 tokens were all reasoning (the generation prompt opens <think>), no answer
    assert r.returncode in (0, 7), r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    ids = [i for x in lines if x["type"] == "chunk" for i in x["token_ids"]]
    usage = lines[-1]["usage"]
    return ids, usage["prompt_tokens"], usage["cached_tokens"]


def create(d, name, *args):
    r = d.x4ctl("--json", "snapshot", "create", "--replace", name, *args, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["n_tokens"]


def test_a_system_only_snapshot_is_the_start_of_the_conversation(daemon):
    n = create(daemon, "sys", "--system", SYSTEM)
    full = gen_json(daemon, *GEN, "--system", SYSTEM, "hello there")
    # the request's own system message, the same as the snapshot's, is not rendered twice; left
    # out, the snapshot's is the conversation's
    for extra in (("--system", SYSTEM), ()):
        ids, prompt, cached = gen_json(daemon, *GEN, "--snapshot", "sys", *extra, "hello there")
        assert (ids, prompt) == full[:2], (extra, prompt, full[1])
        assert cached == n  # the snapshot's tokens came from its cache
    assert full[2] == 0 and len(full[0]) == 6
    # one BOS and one system turn: the raw text of that conversation gives the same prompt
    ids, prompt, _ = gen_json(daemon, *GEN, "--raw", "--snapshot", "sys", "<_user>hello there<_bot><think>\n")
    assert (ids, prompt) == full[:2]


def test_a_snapshot_of_a_conversation_is_continued_or_recognised(daemon):
    n = create(daemon, "conv", "--system", SYSTEM, "first question")
    # a request that resends the snapshot's whole conversation gets it once
    full = gen_json(daemon, *GEN, "--system", SYSTEM, "first question")
    assert gen_json(daemon, *GEN, "--snapshot", "conv", "--system", SYSTEM, "first question") == (*full[:2], n)
    # a request with the next message only: the snapshot's messages, then it
    ids, prompt, cached = gen_json(daemon, *GEN, "--snapshot", "conv", "second question")
    want = gen_json(daemon, *GEN, "--raw", f"{BOS}<_system>{SYSTEM}<_user>first question<_user>second question"
                    "<_bot><think>\n")
    assert (ids, prompt, cached) == (*want[:2], n)


def test_a_different_system_message_is_refused_naming_both(daemon):
    create(daemon, "sysb", "--system", SYSTEM)
    r = daemon.x4ctl("generate", *GEN, "--snapshot", "sysb", "--system", "You are verbose.", "hi",
                     stdin=subprocess.DEVNULL)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "system message" in r.stderr and "You are verbose." in r.stderr and SYSTEM in r.stderr, r.stderr
    assert "snapshot 'sysb'" in r.stderr, r.stderr
    # a snapshot whose conversation has no system message cannot get one from the request
    create(daemon, "nosys", "just a question")
    r = daemon.x4ctl("generate", *GEN, "--snapshot", "nosys", "--system", SYSTEM, "hi",
                     stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "snapshot 'nosys'" in r.stderr and "without one" in r.stderr, r.stderr
    assert daemon.x4ctl("health").returncode == 0


def test_the_generation_prompt_is_refused_in_a_chat_snapshot(daemon):
    c = w.Conn(daemon.sock)
    c.hello()
    msg = w.field_bytes(1, w.field_bytes(1, "system") + w.field_bytes(2, SYSTEM))
    chat = msg + w.field_varint(4, 1)  # add_generation_prompt: true
    c.send(w.frame(3, w.SNAPSHOT, w.field_varint(1, 1) + w.field_bytes(2, "gp") + w.field_bytes(6, chat)))
    code, text = w.error_of(c.recv())
    assert code == "INVALID_ARGUMENT" and "SnapshotRequest.chat.add_generation_prompt" in text, text
    c.close()


def test_raw_snapshots_keep_prepending(daemon):
    """A token snapshot is a token prefix: any request's prompt, prepared on its own, follows it
    (a chat request keeps its own BOS and system turn then)."""
    n = create(daemon, "toks", "--tokens", "5,6,7,8,9")
    alone = gen_json(daemon, *GEN, "--system", SYSTEM, "hello there")
    _, prompt, cached = gen_json(daemon, *GEN, "--snapshot", "toks", "--system", SYSTEM, "hello there")
    assert (prompt, cached) == (n + alone[1], n)
    # raw text on a chat snapshot follows its tokens too
    m = create(daemon, "sysr", "--system", SYSTEM)
    _, prompt, cached = gen_json(daemon, *GEN, "--raw", "--snapshot", "sysr", "<_user>hi")
    raw = gen_json(daemon, *GEN, "--raw", "<_user>hi")
    assert (prompt, cached) == (m + raw[1], m)


def test_a_version_1_snapshot_file_keeps_its_meaning(daemon):
    """A snapshot file written before chat snapshots (version 1: header, tokens, pages) still
    loads, as a raw snapshot: its tokens are prepended to a chat request's whole prompt."""
    n = create(daemon, "old", "--tokens", "5,6,7,8,9")
    path = daemon.state / "old.x4snap"
    data = path.read_bytes()
    head = 104  # the version 1 header (daemon/engine/snapshot.c struct snap_header)
    version, = struct.unpack_from("<I", data, 8)
    assert version == 2
    kind, meta_bytes = struct.unpack_from("<II", data, head)
    assert (kind, meta_bytes) == (0, 0)  # raw: no messages
    ext = 32  # struct snap_header_v2
    v1 = bytearray(data[:head] + data[head + ext:])
    v1[8:12] = struct.pack("<I", 1)
    path.write_bytes(bytes(v1))
    alone = gen_json(daemon, *GEN, "--system", SYSTEM, "hello there")
    ids, prompt, cached = gen_json(daemon, *GEN, "--snapshot", "old", "--system", SYSTEM, "hello there")
    assert (prompt, cached) == (n + alone[1], n)
    r = daemon.x4ctl("snapshot", "list", "--json")
    assert ("old", n) in [(x["name"], x["n_tokens"]) for x in json.loads(r.stdout)]
    # a version 2 header that says chat but holds no conversation is refused, naming the file
    bad = bytearray(data)
    bad[head:head + 4] = struct.pack("<I", 1)
    path.write_bytes(bytes(bad))
    r = daemon.x4ctl("generate", "--snapshot", "old", "hi", stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and f"snapshot {path}: kind 1 with 0 bytes of conversation" in r.stderr, r.stderr
    assert daemon.x4ctl("snapshot", "drop", "old").returncode == 0


def test_a_template_whose_rendering_is_not_a_prefix_is_refused(tmp_path):
    d = Daemon(tmp_path / "d", args=("--model", str(model_with(tmp_path / "m", UNSTABLE_TEMPLATE))))
    try:
        create(d, "sys", "--system", SYSTEM)
        r = d.x4ctl("generate", *GEN, "--snapshot", "sys", "hello", stdin=subprocess.DEVNULL)
        assert r.returncode == 1, r.stderr
        assert "snapshot 'sys'" in r.stderr and "does not start with the snapshot's" in r.stderr, r.stderr
        assert d.x4ctl("health").returncode == 0
    finally:
        d.close()


def test_a_damaged_conversation_is_refused_naming_the_snapshot(daemon):
    """A chat snapshot whose conversation (version 2: after the token ids, before the pages) does
    not read back is refused by name, and the daemon goes on serving."""
    n = create(daemon, "dmg", "--system", SYSTEM)
    path = daemon.state / "dmg.x4snap"
    data = path.read_bytes()
    head, ext = 104, 32
    kind, meta_bytes = struct.unpack_from("<II", data, head)
    at = head + ext + 4 * n
    assert kind == 1 and json.loads(data[at:at + meta_bytes]) == {"messages": [{"role": "system", "content": SYSTEM}]}
    for meta, says in ((b'{"messages":[{}]}', "message 0 has no role"), (b"[1,", "does not read back")):
        bad = bytearray(data[:at] + meta + data[at + meta_bytes:])
        bad[head + 4:head + 8] = struct.pack("<I", len(meta))
        path.write_bytes(bytes(bad))
        r = daemon.x4ctl("generate", *GEN, "--snapshot", "dmg", "hi", stdin=subprocess.DEVNULL)
        assert r.returncode == 1 and "snapshot 'dmg': its conversation does not read back" in r.stderr, r.stderr
        assert says in r.stderr, r.stderr
    assert daemon.x4ctl("health").returncode == 0


def wire_chat(messages, tools=None):
    body = b"".join(w.field_bytes(1, w.field_bytes(1, role) + w.field_bytes(2, text)) for role, text in messages)
    return body + (w.field_bytes(2, tools) if tools is not None else b"")


def wire_generate(c, rid, chat, snapshot):
    """Done fields or (code, message) of an Error for one chat request on a snapshot."""
    c.send(w.frame(rid, w.GENERATE, w.field_bytes(3, chat) + w.field_bytes(8, snapshot) + w.field_varint(5, 1)))
    while True:
        f = c.recv()
        if w.ERROR in f:
            return w.error_of(f)
        if w.DONE in f:
            return w.parse(f[w.DONE][0])


def test_the_snapshots_tools_are_the_conversations(daemon):
    """A chat snapshot keeps its tools: a request may leave them out or send the same ones (the
    JSON's spacing aside); other tools, or tools on a snapshot made without, are refused."""
    tools = '[{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]'
    c = w.Conn(daemon.sock)
    c.hello()
    for rid, name, t in ((1, "withtools", tools), (2, "notools", None)):
        c.send(w.frame(rid, w.SNAPSHOT, w.field_varint(1, 1) + w.field_bytes(2, name) + w.field_bytes(6, wire_chat([("system", SYSTEM)], t))))
        f = c.recv()
        assert w.SNAPSHOT_REPLY in f, f
    hi = [("user", "hi")]
    done = wire_generate(c, 3, wire_chat(hi), "withtools")
    assert isinstance(done, dict), done
    same = wire_generate(c, 4, wire_chat(hi, json.dumps(json.loads(tools), separators=(",", ":"))), "withtools")
    usage = [{k: w.parse(d[2][0])[k] for k in (1, 2)} for d in (done, same)]  # prompt, cached tokens
    assert usage[0] == usage[1], usage
    code, msg = wire_generate(c, 5, wire_chat(hi, tools.replace("now", "later")), "withtools")
    assert code == "INVALID_ARGUMENT" and msg.startswith(
        "prompt.chat.tools_json: differs from the tools snapshot 'withtools' was made with"), msg
    code, msg = wire_generate(c, 6, wire_chat(hi, tools), "notools")
    assert code == "INVALID_ARGUMENT" and "snapshot 'notools' was made without tools" in msg, msg
    c.close()
