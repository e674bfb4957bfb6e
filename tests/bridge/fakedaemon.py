# SPDX-License-Identifier: MIT
"""A scripted stand-in for xing4d speaking the real protocol (proto/xing4.proto, hand-encoded),
so the bridge's mapping of outputs a random synthetic model never produces (tool calls, a daemon
error after the first token, exact chunk sequences) can be tested deterministically.

What it answers depends on the request:
  - chat whose last message is a tool result: content "It is sunny in Paris." (finish stop)
  - chat with tools: a reasoning chunk, then a finished tool call get_weather {"city": "Paris"}
    (channel TOOL_CALL, finish TOOL_CALLS); a call forced to another tool: that tool with
    {"answer": "yes"}
  - last message "stop-here": "Up to the", finish stop on the stop string "END"
  - last message "think-long": two reasoning chunks, finish length (the budget ran out thinking)
  - last message "say-nothing": no chunk, finish stop (the turn ended before any text)
  - a JSON constraint (json_object / json_schema): content {"answer": "yes"} in two chunks
  - last message "logprob-specials": chunks with logprobs: reasoning, </think> (no text), "Hel",
    "lo", " wor" held back then " world" with "ld", <_end> (no text)
  - chat with tools, last message "call-specials": </think>, the call get_weather, <_end>, with
    logprobs
  - last user message "flood-N": N content chunks of 1000 characters ("0000xxx...", "0001xxx..."),
    each sent only while the request is not paused by a Pause frame; each Pause is recorded as
    {"pause": true|false}
  - last message "cancelled-elsewhere": one chunk, then Done{CANCELLED}
  - last message "cancelled-by-shutdown": the same with Done.server_shutdown (the daemon's grace
    period ran out)
  - last message "slow": one chunk, then waits up to 5 s for a Cancel (Done{CANCELLED}) else ends
  - last message "silent": the same wait before any chunk (a long prefill)
  - last user message "error-after-start": one content chunk, then Error{INTERNAL}
  - last user message "error-internal": Error{INTERNAL} at once
  - last user message "error-invalid": Error{INVALID_ARGUMENT}
  - last user message "slow-N": nothing for N seconds (a long prefill), then as below
  - last user message "late-invalid": after 1.5 s, Error{INVALID_ARGUMENT} "prompt of ... leaves no
    room ..." (a long prompt's tokenization, then the context refusal)
  - last user message "progress-2": a PrefillProgress frame, 2 s of silence, then as below
  - last user message "call-slow": a tool-call token (no text), 2.5 s, then the call get_weather
  - last user message "hang-up": no answer, the connection closed (the daemon gone mid-request)
  - chat with tools, last message "two-calls": calls get_weather {"city": "Paris"} and {"city":
    "Rome"}, then waits up to 5 s for a Cancel (Done{CANCELLED}, 1 completion token) else a third
    call (Tokyo) and Done{TOOL_CALLS}
  - chat with a tool named apply_patch, last message "patch-it": the call apply_patch
    {"input": PATCH}
  - a system message "fake-context-4000": a prompt whose messages hold more than 4000 bytes is
    refused Error{TOO_LARGE} "prompt of N tokens leaves no room for output in the context limit of
    4000 tokens" (N: those bytes), as xing4d refuses a prompt over its context
  - anything else: reasoning "Let me think.", content "Hello" + ", world", finish stop,
    usage 7 prompt / 3 cached / 3 completion / 1 reasoning
Every GenerateRequest is appended (decoded) to --record as a JSON line.

Run: python3 fakedaemon.py --socket PATH [--record FILE]; prints "ready" when listening."""
import argparse
import json
import os
import socket
import struct
import sys
import threading
import time

# ---- protobuf wire format: the tests' one codec, tests/integration/x4wire.py -----------------------

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from x4wire import (CANCEL, CHUNK, DONE, ERROR, GENERATE, HEALTH, HEALTH_REPLY, PROGRESS,  # noqa: E402,F401
                    HELLO, HELLO_REPLY, INFO, INFO_REPLY, STATS, STATS_REPLY, parse, varint)
from x4wire import field_bytes as fb  # noqa: E402
from x4wire import field_varint as fv  # noqa: E402


from x4wire import PAUSE  # noqa: E402


def s(m, k, default=""):
    return m[k][0].decode() if k in m else default


CONTENT, REASONING, TOOL_CALL = 0, 1, 2
FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED, FINISH_TOOL_CALLS = 1, 2, 3, 4
E_INVALID, E_TOO_LARGE, E_INTERNAL = 1, 4, 7
WAIT_CANCEL = "wait-cancel"  # script step: wait up to N s for a Cancel; one ends it with Done{CANCELLED}

MODEL = fb(1, "xing4_0") + fb(2, "fake xing4d") + fb(3, "fake-fingerprint") + fv(4, 512) + fv(5, 4096)


def decode_generate(g):
    out = {}
    if 1 in g:
        out["text"] = s(g, 1)
    if 3 in g:
        chat = parse(g[3][0])
        out["messages"] = []
        for m in chat.get(1, []):
            pm = parse(m)
            msg = {"role": s(pm, 1), "content": s(pm, 2)}
            # ChatMessage's optional fields, only when sent: reasoning, tool_calls_json, name
            for num, key in ((3, "reasoning"), (4, "tool_calls"), (5, "name")):
                if num in pm:
                    msg[key] = json.loads(s(pm, num)) if key == "tool_calls" else s(pm, num)
            out["messages"].append(msg)
        if 2 in chat:
            out["tools"] = json.loads(s(chat, 2))
        if 3 in chat:
            out["enable_thinking"] = bool(chat[3][0])
        if 4 in chat:
            out["add_generation_prompt"] = bool(chat[4][0])
    if 5 in g:
        out["max_tokens"] = g[5][0]
    if 6 in g:
        out["stop"] = [x.decode() for x in g[6]]
    if 4 in g:
        sp = parse(g[4][0])
        out["sampling_fields"] = sorted(sp)
        names = {1: "temperature", 2: "top_p", 3: "top_k", 4: "min_p", 5: "seed"}
        out["sampling"] = {names[k]: (round(struct.unpack("<f", v[0])[0], 6) if isinstance(v[0], bytes) else v[0])
                           for k, v in sp.items() if k in names}
    if 10 in g:
        v = g[10][0]
        out["thinking_budget"] = v - (1 << 64) if v >= 1 << 63 else v
    if 11 in g:
        out["ignore_eos"] = bool(g[11][0])
    if 15 in g:
        out["count_only"] = bool(g[15][0])
    if 13 in g:
        # Constraint {json_object = 1 | json_schema = 2 | tool = 3 {name = 1} | tool_calls = 5 {name = 1}}
        c = parse(g[13][0])
        if 1 in c:
            out["constraint"] = {"json_object": bool(c[1][0])}
        elif 2 in c:
            out["constraint"] = {"json_schema": json.loads(s(c, 2))}
        elif 3 in c:
            out["constraint"] = {"tool": s(parse(c[3][0]), 1, None)}
        elif 5 in c:
            out["constraint"] = {"tool_calls": s(parse(c[5][0]), 1, None)}
        else:
            out["constraint"] = {}
        if 4 in c:
            out["constraint_lenient"] = bool(c[4][0])
        if 6 in c:
            out["constraint_or_tool_calls"] = bool(c[6][0])
    return out


def chunk(text, channel=CONTENT, tool=None, token=1, lp=None):
    """lp: the token's text, for a logprob (-0.5) whose one alternative is the token itself."""
    body = fb(1, text) + fb(2, varint(token)) + fv(3, channel)
    if lp is not None:
        f = b"\x15" + struct.pack("<f", -0.5)
        body += fb(4, fv(1, token) + f + fb(3, fv(1, token) + f + fb(3, lp)))
    if tool:
        body += fb(5, fb(1, tool[0]) + fb(2, tool[1]))
    return body


def done(finish, prompt=7, cached=3, completion=3, reasoning=1, srid=42, stop=None, shutdown=False):
    usage = fv(1, prompt) + fv(2, cached) + fv(3, completion) + fv(4, reasoning)
    return (fv(1, finish) + fb(2, usage) + (fb(4, stop) if stop else b"") + fv(5, srid) +
            (fv(6, 1) if shutdown else b""))


def error(code, msg):
    return fv(1, code) + fb(2, msg)


PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello\n*** End Patch\n"


def script(req):
    """The list of (body field, body bytes) answering one GenerateRequest."""
    msgs = req.get("messages", [])
    last = msgs[-1] if msgs else {"role": "user", "content": req.get("text", "")}
    if any(m["role"] == "system" and m["content"] == "fake-context-4000" for m in msgs):
        n = sum(len(m["content"].encode()) for m in msgs)
        if n > 4000:
            return [(ERROR, error(E_TOO_LARGE, f"prompt of {n} tokens leaves no room for output in the context "
                                               "limit of 4000 tokens"))]
    names = [t.get("function", {}).get("name") for t in req.get("tools", [])]
    if "apply_patch" in names and last["content"] == "patch-it":
        return [(CHUNK, chunk("", TOOL_CALL, ("apply_patch", json.dumps({"input": PATCH})), token=6)),
                (DONE, done(FINISH_TOOL_CALLS))]
    if req.get("tools") and last["content"] == "call-specials":
        return [(CHUNK, chunk("", token=11, lp="</think>")),
                (CHUNK, chunk("", TOOL_CALL, ("get_weather", '{"city": "Paris"}'), token=6, lp="}")),
                (CHUNK, chunk("", token=16, lp="<_end>")), (DONE, done(FINISH_TOOL_CALLS))]
    if req.get("tools") and last["content"] == "two-calls":
        return [(CHUNK, chunk("Two cities.", REASONING)),
                (CHUNK, chunk("", TOOL_CALL, ("get_weather", '{"city": "Paris"}'), token=6)),
                (CHUNK, chunk("", TOOL_CALL, ("get_weather", '{"city": "Rome"}'), token=7)),
                (WAIT_CANCEL, 5.0),
                (CHUNK, chunk("", TOOL_CALL, ("get_weather", '{"city": "Tokyo"}'), token=8)),
                (DONE, done(FINISH_TOOL_CALLS))]
    if last["role"] == "tool":
        return [(CHUNK, chunk("It is sunny in Paris.")), (DONE, done(FINISH_STOP))]
    forced = req.get("constraint", {}).get("tool")
    if req.get("tools") and forced not in (None, "get_weather"):
        # a forced call of another tool (structured output through function calling)
        return [(CHUNK, chunk("", TOOL_CALL, (forced, '{"answer": "yes"}'), token=6)), (DONE, done(FINISH_TOOL_CALLS))]
    if req.get("tools"):
        return [(CHUNK, chunk("Need weather.", REASONING)),
                (CHUNK, chunk("", TOOL_CALL, token=5)),
                (CHUNK, chunk("", TOOL_CALL, ("get_weather", '{"city": "Paris"}'), token=6)),
                (DONE, done(FINISH_TOOL_CALLS))]
    if last["content"] == "logprob-specials":
        # each token with its logprob: </think> and <_end> make no text, " wor" is held back (a
        # possible stop string) until "ld" comes
        return [(CHUNK, chunk("Hmm", REASONING, token=10, lp="Hmm")),
                (CHUNK, chunk("", token=11, lp="</think>")),
                (CHUNK, chunk("Hel", token=12, lp="Hel")), (CHUNK, chunk("lo", token=13, lp="lo")),
                (CHUNK, chunk("", token=14, lp=" wor")), (CHUNK, chunk(" world", token=15, lp="ld")),
                (CHUNK, chunk("", token=16, lp="<_end>")), (DONE, done(FINISH_STOP, completion=7))]
    if last["content"] == "cancelled-elsewhere":
        return [(CHUNK, chunk("Half")), (DONE, done(FINISH_CANCELLED, completion=1))]
    if last["content"] == "cancelled-by-shutdown":
        return [(CHUNK, chunk("Half")), (DONE, done(FINISH_CANCELLED, completion=1, shutdown=True))]
    if last["content"] == "silent":
        return [(WAIT_CANCEL, 5.0), (CHUNK, chunk("Late")), (DONE, done(FINISH_STOP, completion=1))]
    if last["content"] == "slow":
        return [(CHUNK, chunk("Slowly")), (WAIT_CANCEL, 5.0), (DONE, done(FINISH_STOP, completion=1))]
    if last["content"] == "stop-here":
        return [(CHUNK, chunk("Up to the")), (DONE, done(FINISH_STOP, stop="END"))]
    if last["content"] == "say-nothing":
        return [(DONE, done(FINISH_STOP, completion=1, reasoning=0))]
    if last["content"] == "think-long":
        return [(CHUNK, chunk("Thinking", REASONING)), (CHUNK, chunk(" on and on", REASONING)),
                (DONE, done(FINISH_LENGTH, completion=2, reasoning=2))]
    constraint = req.get("constraint", {})
    if "json_schema" in constraint or "json_object" in constraint:
        return [(CHUNK, chunk('{"answer": ')), (CHUNK, chunk('"yes"}')), (DONE, done(FINISH_STOP))]
    if last["content"] == "error-after-start":
        return [(CHUNK, chunk("partial")), (ERROR, error(E_INTERNAL, "scripted failure after the first token"))]
    if last["content"] == "error-internal":
        return [(ERROR, error(E_INTERNAL, "scripted internal failure"))]
    if last["content"] == "error-invalid":
        return [(ERROR, error(E_INVALID, "sampling.top_k: scripted refusal"))]
    return [(CHUNK, chunk("Let me think.", REASONING)), (CHUNK, chunk("Hello")),
            (CHUNK, chunk(", world")), (DONE, done(FINISH_STOP))]


class Conn(threading.Thread):
    def __init__(self, sock, record):
        super().__init__(daemon=True)
        self.sock = sock
        self.record = record

    def send(self, rid, field, body):
        payload = fv(1, rid) + fb(field, body)
        self.sock.sendall(struct.pack(">I", len(payload)) + payload)

    def wait_cancel(self, buf, seconds):
        """Read frames for up to seconds; (unread bytes, whether a Cancel came)."""
        import select
        import time
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if select.select([self.sock], [], [], deadline - time.monotonic())[0]:
                d = self.sock.recv(65536)
                if not d:
                    return buf, False
                buf += d
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                    n = struct.unpack(">I", buf[:4])[0]
                    f, buf = parse(buf[4:4 + n]), buf[4 + n:]
                    if CANCEL in f:
                        return buf, True
        return buf, False

    def note(self, what):
        if self.record:
            with open(self.record, "a") as out:
                out.write(json.dumps(what) + "\n")

    def flood(self, rid, buf, n):
        """n chunks of 1000 characters, each sent only while the request is not paused (Pause
        frames read between them; each recorded as {"pause": bool})."""
        import select
        paused = False
        i = 0
        while i < n:
            while select.select([self.sock], [], [], 20.0 if paused else 0)[0]:
                d = self.sock.recv(65536)
                if not d:
                    return buf
                buf += d
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                    k = struct.unpack(">I", buf[:4])[0]
                    f, buf = parse(buf[4:4 + k]), buf[4 + k:]
                    if PAUSE in f:
                        p = parse(f[PAUSE][0])
                        paused = bool(p.get(1, [0])[0])
                        self.note({"pause": paused})
                    elif CANCEL in f:
                        self.send(rid, DONE, done(FINISH_CANCELLED, completion=i))
                        return buf
                if not paused:
                    break
            if paused:
                continue
            self.send(rid, CHUNK, chunk("%04d" % i + "x" * 996, token=100 + i))
            i += 1
        self.send(rid, DONE, done(FINISH_STOP, completion=n))
        return buf

    def run(self):
        buf = b""
        try:
            while True:
                while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
                    d = self.sock.recv(65536)
                    if not d:
                        return
                    buf += d
                n = struct.unpack(">I", buf[:4])[0]
                f, buf = parse(buf[4:4 + n]), buf[4 + n:]
                rid = f.get(1, [0])[0]
                if HELLO in f:
                    self.send(0, HELLO_REPLY, fv(1, 1) + fv(2, 6) + fb(3, "xing4d 0.1.0 (fake)") +
                              fb(4, MODEL) + fv(5, 16 << 20) + fb(6, "fake"))
                elif INFO in f:
                    self.send(rid, INFO_REPLY, fb(1, "xing4d 0.1.0 (fake)") + fb(2, MODEL) + fb(3, "fake"))
                elif HEALTH in f:
                    self.send(rid, HEALTH_REPLY, fv(1, 1) + fb(2, "fake daemon"))
                elif STATS in f:
                    self.send(rid, STATS_REPLY, fv(1, 1) + fv(4, 0) + fv(17, 5))
                elif GENERATE in f:
                    req = decode_generate(parse(f[GENERATE][0]))
                    if self.record:
                        with open(self.record, "a") as out:
                            out.write(json.dumps(req) + "\n")
                    msgs = req.get("messages") or [{}]
                    last = msgs[-1].get("content", "")
                    if isinstance(last, str) and last.startswith("slow-"):
                        time.sleep(float(last[5:]))
                        req["messages"][-1]["content"] = "hi"
                    if last == "late-invalid":
                        time.sleep(1.5)
                        self.send(rid, ERROR, error(E_TOO_LARGE, "prompt of 300000 tokens leaves no room for "
                                                    "output in the context limit of 262144 tokens"))
                        continue
                    if last == "hang-up":
                        return  # closes the connection (finally)
                    if isinstance(last, str) and last.startswith("flood-"):
                        buf = self.flood(rid, buf, int(last[6:]))
                        continue
                    if last == "call-slow":
                        self.send(rid, CHUNK, chunk("", TOOL_CALL, token=5))
                        time.sleep(2.5)
                        self.send(rid, CHUNK, chunk("", TOOL_CALL, ("get_weather", '{"city": "Paris"}'), token=6))
                        self.send(rid, DONE, done(FINISH_TOOL_CALLS))
                        continue
                    if last == "progress-2":
                        self.send(rid, PROGRESS, fv(1, 100) + fv(2, 1000))
                        time.sleep(2)
                        req["messages"][-1]["content"] = "hi"
                    for field, body in script(req):
                        if field == WAIT_CANCEL:
                            buf, cancelled = self.wait_cancel(buf, body)
                            if cancelled:
                                self.send(rid, DONE, done(FINISH_CANCELLED, completion=1))
                                break
                            continue
                        self.send(rid, field, body)
                elif CANCEL in f:
                    pass
        except OSError:
            return
        finally:
            self.sock.close()


def serve(path, record=None):
    if os.path.exists(path):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)

    def loop():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            Conn(c, record).start()
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return srv


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--record")
    a = ap.parse_args()
    srv = serve(a.socket, a.record)
    print("ready", flush=True)
    try:
        sys.stdin.read()  # until the parent closes our stdin (or kills us)
    except KeyboardInterrupt:
        pass
    srv.close()
