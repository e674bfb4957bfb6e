# SPDX-License-Identifier: MIT
"""The whole daemon on the CPU backend with the tiny fixture model, driven by x4ctl, a C program
linked against libx4client, and raw frames for the inputs no client library would send."""
import json
import signal
import struct
import subprocess
import sys
from pathlib import Path
import time

import pytest

import x4wire as w
from conftest import MODEL, N_VOCAB, XING4D

PROMPT = "5,6,7,8,9,10,11,12"


def gen_json(daemon, *args):
    r = daemon.x4ctl("--json", "generate", *args)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    return r, lines


# ---- start-up, handshake, info -------------------------------------------------------------------

def test_socket_activation_reports_loading_then_ready(daemon):
    # STATUS=loading came before READY=1, as a Type=notify unit's `systemctl status` shows it
    joined = "\n".join(daemon.messages)
    assert "STATUS=loading" in joined
    assert joined.index("STATUS=loading") < joined.index("READY=1")
    r = daemon.x4ctl("health")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("serving")


def test_info_describes_the_model(daemon):
    r = daemon.x4ctl("info", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["server_version"] == "xing4d 0.1.0"
    assert info["backend"] == "cpu"
    m = info["model"]
    assert (m["architecture"], m["n_vocab"], m["n_layer"], m["n_embd"]) == ("xing4_0", N_VOCAB, 3, 256)
    assert (m["n_expert"], m["n_expert_used"]) == (8, 2)
    # 64 pages x 256 tokens from the test config, below the model's trained context
    assert m["n_ctx"] == 64 * 256
    assert info["cache_pages_total"] == 64 and info["cache_page_tokens"] == 256
    assert info["max_running"] == 4  # from the INI file
    # a request without an output limit may run to 16,384 tokens (clients such as Codex send none)
    assert info["max_tokens_default"] == 16384, info


# ---- generation ------------------------------------------------------------------------------------

def test_greedy_generation_is_reproducible(daemon):
    r1, a = gen_json(daemon, "--tokens", PROMPT, "--temperature", "0", "--max-tokens", "12")
    r2, b = gen_json(daemon, "--tokens", PROMPT, "--temperature", "0", "--max-tokens", "12")
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    ids_a = [i for x in a if x["type"] == "chunk" for i in x["token_ids"]]
    ids_b = [i for x in b if x["type"] == "chunk" for i in x["token_ids"]]
    assert ids_a == ids_b
    assert all(0 <= i < N_VOCAB for i in ids_a)
    done = a[-1]
    assert done["type"] == "done"
    assert done["usage"]["prompt_tokens"] == 8
    # EOS may end it early, otherwise exactly max_tokens
    assert done["usage"]["completion_tokens"] == len(ids_a)
    assert (done["finish_reason"], len(ids_a)) in {("length", 12)} or done["finish_reason"] == "stop"


def test_seeded_sampling_is_reproducible_and_seed_matters(daemon):
    def run(seed):
        r, lines = gen_json(daemon, "--tokens", PROMPT, "--temperature", "1.5", "--seed", str(seed),
                            "--max-tokens", "24", "--ignore-eos")
        assert r.returncode == 0, r.stderr
        return [i for x in lines if x["type"] == "chunk" for i in x["token_ids"]]
    a, b, c = run(1), run(1), run(2)
    assert a == b and len(a) == 24
    assert a != c  # 24 draws at temperature 1.5 from 512 ids: equal only by a bug


def test_logprobs_are_normalised(daemon):
    r, lines = gen_json(daemon, "--tokens", PROMPT, "--temperature", "0", "--max-tokens", "3",
                        "--logprobs", "5", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    chunks = [x for x in lines if x["type"] == "chunk"]
    assert len(chunks) == 3
    for ch in chunks:
        lp = ch["logprobs"][0]
        top = lp["top"]
        assert len(top) == 5
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        # greedy: the chosen token is the most likely one, and log-probabilities are <= 0
        assert lp["token_id"] == top[0]["token_id"] == ch["token_ids"][0]
        assert abs(lp["logprob"] - top[0]["logprob"]) < 1e-6
        assert all(t["logprob"] <= 1e-6 for t in top)
        # each alternative carries its text (the fixture has a tokenizer), the chosen one's is
        # the chunk's text unless the stream held bytes back
        assert all(isinstance(t.get("text"), str) for t in top), top
        assert len({t["text"] for t in top}) >= 2


def test_text_and_chat_prompts_are_tokenized(daemon):
    r = daemon.x4ctl("generate", "--raw", "--temperature", "0", "--max-tokens", "5", "hello world")
    assert r.returncode == 0, r.stderr
    r, lines = gen_json(daemon, "--no-think", "--temperature", "0", "--max-tokens", "5",
                        "--system", "be brief", "hello")
    assert r.returncode == 0, r.stderr
    done = lines[-1]
    assert done["type"] == "done"
    # the chat template adds its markers around the 2 messages: more tokens than the words
    assert done["usage"]["prompt_tokens"] > 4


def test_stop_id_ends_generation(daemon):
    _, lines = gen_json(daemon, "--tokens", PROMPT, "--temperature", "0", "--max-tokens", "6",
                        "--ignore-eos")
    ids = [i for x in lines if x["type"] == "chunk" for i in x["token_ids"]]
    stop_at = ids[3]
    first = ids.index(stop_at)
    r, lines = gen_json(daemon, "--tokens", PROMPT, "--temperature", "0", "--max-tokens", "6",
                        "--ignore-eos", "--stop-id", str(stop_at))
    assert r.returncode == 0, r.stderr
    got = [i for x in lines if x["type"] == "chunk" for i in x["token_ids"]]
    # the stop token itself is reported (and counted) but shows no text
    assert got == ids[:first + 1] and lines[-1]["finish_reason"] == "stop"
    assert lines[-2]["token_ids"] == [stop_at] and lines[-2]["text"] == ""
    assert lines[-1]["usage"]["completion_tokens"] == first + 1


# ---- bad input: each refused with a message naming the problem ------------------------------------

# x4ctl says the option it filled a field from, not the protocol's name for the field
# (sampling ranges are x4ctl's own usage errors: test_x4ctl_input.py)
@pytest.mark.parametrize("args,message", [
    (["--tokens", "5,99999"], f"--tokens: item 2, id 99999 is out of range [0, {N_VOCAB})"),
    (["--tokens", PROMPT, "--logprobs", "21"], "--logprobs: 21, at most 20 supported"),
    (["--tokens", PROMPT, "--stop-id", "600"], f"--stop-id: id 600 is out of range [0, {N_VOCAB})"),
    (["--tokens", PROMPT, "--stop", "a", "--stop", "b" * 300],
     "--stop number 2: 300 bytes, 1..256 expected"),
    (["--tokens", PROMPT, "--snapshot", "no/such"],
     "snapshot name 'no/such': character 3 is not one of A-Z a-z 0-9 . _ -"),
])
def test_bad_requests_are_refused_with_a_message(daemon, args, message):
    r = daemon.x4ctl("generate", *args)
    assert r.returncode == 1
    assert r.stderr == f"x4ctl: {message}\n"
    # and the daemon keeps serving
    assert daemon.x4ctl("health").returncode == 0


def test_prompt_longer_than_the_context_is_too_large(daemon):
    ids = ",".join(["5"] * (64 * 256))
    r = daemon.x4ctl("generate", "--tokens", ids)
    assert r.returncode == 1
    assert r.stderr == ("x4ctl: prompt of 16384 tokens leaves no room for output in the context "
                        "limit of 16384 tokens\n")


def test_the_protocol_names_fields_not_options(daemon):
    # API clients (the bridge) rely on the field's name: only x4ctl says its options' names
    c = w.Conn(daemon.sock)
    c.hello()
    c.send(w.frame(1, w.GENERATE, w.generate_tokens([5, 6, 7], temperature=-1.0)))
    assert w.error_of(c.recv()) == ("INVALID_ARGUMENT", "sampling.temperature: -1 is out of range [0, 100]")
    c.send(w.frame(2, w.GENERATE, w.generate_tokens([5, 99999])))
    assert w.error_of(c.recv()) == ("INVALID_ARGUMENT",
                                    f"prompt.tokens[1]: id 99999 is out of range [0, {N_VOCAB})")
    c.close()


def test_max_tokens_zero_is_refused_by_the_daemon(daemon):
    # x4ctl refuses it before connecting (below); a client that sends it gets the daemon's word
    c = w.Conn(daemon.sock)
    c.hello()
    c.send(w.frame(1, w.GENERATE, w.generate_tokens([5, 6, 7], max_tokens=0)))
    assert w.error_of(c.recv()) == ("INVALID_ARGUMENT", "max_tokens: 0, at least 1 expected")
    c.close()
    assert daemon.x4ctl("health").returncode == 0


def test_x4ctl_usage_and_connection_errors(daemon, tmp_path):
    r = daemon.x4ctl("generate", "--top-p", "abc", "x")
    assert r.returncode == 2 and "--top-p: 'abc' is not a number" in r.stderr
    # what the daemon would refuse anyway is a usage error before connecting (exit 2, not 1)
    r = daemon.x4ctl("generate", "--max-tokens", "0", "x")
    assert r.returncode == 2 and "--max-tokens: '0' is not a count from 1 to 4294967295" in r.stderr
    r = daemon.x4ctl("generate", "--stop", "", "x")
    assert r.returncode == 2 and "--stop: an empty stop string would match everywhere" in r.stderr
    r = subprocess.run([str(daemon_x4ctl()), "--socket", str(tmp_path / "none.sock"), "health"],
                       capture_output=True, text=True)
    assert r.returncode == 3
    assert r.stderr.startswith(f"x4ctl: {tmp_path / 'none.sock'}: cannot connect: No such file or directory\n"
                               "x4ctl: hint: is xing4d running? Start it with: sudo systemctl start xing4d.socket"), \
        r.stderr
    r = daemon.x4ctl("cancel", "999999")
    assert r.returncode == 5
    assert r.stderr == "x4ctl: cancel: request 999999 is not waiting or running\n"


def daemon_x4ctl():
    from conftest import X4CTL
    return X4CTL


# ---- raw protocol abuse ----------------------------------------------------------------------------

def test_oversized_frame_is_refused_before_allocating(daemon):
    c = w.Conn(daemon.sock)
    c.hello()
    c.send_raw(struct.pack(">I", 0xFFFFFFFF) + b"x" * 16)
    code, msg = w.error_of(c.recv())
    assert code == "TOO_LARGE"
    assert msg == "frame payload of 4294967295 bytes exceeds the limit of 16777216 bytes"
    assert c.closed_by_server()  # the stream lost sync: hang up
    assert daemon.x4ctl("health").returncode == 0


def test_undecodable_and_bodiless_frames_keep_the_connection(daemon):
    c = w.Conn(daemon.sock)
    c.hello()
    c.send(b"\xff\xff\xff")
    code, msg = w.error_of(c.recv())
    assert (code, msg) == ("PROTOCOL", "frame of 3 bytes is not a valid xing4.Frame message")
    c.send(b"")
    assert w.error_of(c.recv()) == ("PROTOCOL", "frame has no body (or one this server does not know)")
    c.send(w.frame(3, w.DONE))
    assert w.error_of(c.recv()) == ("PROTOCOL", "frame body 'done' is sent by the server, not by clients")
    c.send(w.frame(0, w.GENERATE, w.generate_tokens([5, 6], max_tokens=2)))
    assert w.error_of(c.recv()) == ("PROTOCOL", "GenerateRequest: request_id 0 is reserved for "
                                                "connection frames, choose a nonzero id")
    # still serving this connection
    c.send(w.frame(7, w.HEALTH))
    f = c.recv()
    assert w.HEALTH_REPLY in f and f[1] == [7]
    c.close()


def test_first_frame_must_be_hello(daemon):
    c = w.Conn(daemon.sock)
    c.send(w.frame(1, w.STATS))
    assert w.error_of(c.recv()) == ("PROTOCOL", "first frame must be Hello, got 'stats'")
    assert c.closed_by_server()


def test_protocol_major_mismatch(daemon):
    c = w.Conn(daemon.sock)
    c.send(w.frame(0, w.HELLO, w.hello(major=2)))
    assert w.error_of(c.recv()) == ("VERSION_MISMATCH",
                                    "Hello.proto_major: 2, this server speaks protocol 1.6")
    assert c.closed_by_server()


def test_duplicate_request_id_and_closing_cancels(daemon):
    c = w.Conn(daemon.sock)
    c.hello()
    # ignore_eos: the model's own end would finish it before the hang-up on a loaded machine
    long_req = w.generate_tokens([5, 6, 7], max_tokens=100000, temperature=0.0, ignore_eos=True)
    c.send(w.frame(5, w.GENERATE, long_req))
    c.send(w.frame(5, w.GENERATE, long_req))
    while True:  # chunks of the first one stream in before/after the refusal
        f = c.recv()
        if w.ERROR in f:
            break
    assert w.error_of(f) == ("PROTOCOL", "GenerateRequest: request_id 5 is already in flight on "
                                         "this connection")
    before = daemon.stats()["requests_cancelled"]
    c.close()  # hanging up cancels the request and frees its pages
    # (the Error may arrive before the first request was even admitted: wait for it to be gone)
    # The engine may not have published the request yet when the Error arrives, so "no
    # requests listed" alone can hold before the cancellation happened (seen under ASan in CI):
    # wait for the cancellation itself, then check nothing else changed.
    s = daemon.wait_stats(lambda s: not s["requests"] and s["requests_cancelled"] > before,
                          what="the request cancelled and gone")
    assert s["cache_pages_used"] == 0
    assert s["requests_cancelled"] == before + 1


# ---- stats ---------------------------------------------------------------------------------------

def test_stats_rates_match_what_a_request_saw(fresh_daemon):
    """After one request whose prompt is a single prefill step, `x4ctl stats` shows the prefill
    and decode rates that request measured (its own timings), not a fraction of them: the rates
    are recent averages, and the first sample must be taken as it is."""
    d = fresh_daemon(args=("--prefill-chunk", "256"))
    prompt = ",".join(str(5 + i % 400) for i in range(200))
    r = d.x4ctl("--json", "generate", "--tokens", prompt, "--ignore-eos", "--max-tokens", "24")
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout.splitlines()[-1])
    t = done["timings"]
    assert done["usage"]["prompt_tokens"] == 200 and done["usage"]["completion_tokens"] == 24
    seen_prefill = 200 * 1e3 / t["prefill_ms"]
    seen_decode = 23 * 1e3 / t["decode_ms"]
    s = d.stats()
    # prefill_ms also holds the first token's sampling and the reply, decode_ms the replies and
    # the engine's waits between steps: the stats (step times only) are never much slower than
    # what the request saw (an average started from zero showed a fraction of it), and may be
    # several times faster on a loaded machine (CI's two cores: 7x seen), never a unit off (1000x)
    assert 0.5 * seen_prefill <= s["prefill_tok_s"] <= 25 * seen_prefill, (s, t)
    assert 0.4 * seen_decode <= s["decode_tok_s"] <= 25 * seen_decode, (s, t)


# ---- cancellation ----------------------------------------------------------------------------------

def start_long(daemon):
    before = daemon.stats()
    p = daemon.x4ctl_popen("--json", "generate", "--tokens", PROMPT, "--ignore-eos",
                           "--max-tokens", "100000")
    s = daemon.wait_stats(lambda s: s["requests_running"] == 1 and s["requests"],
                          what="the long request running")
    return p, s, before


def test_x4ctl_cancel_frees_the_pages(daemon):
    p, s, before = start_long(daemon)
    # pages are taken as the sequence grows: a few tokens hold one page, not prompt + max output
    assert 1 <= s["cache_pages_used"] < 64
    req = s["requests"][0]
    assert req["client"] == "x4ctl 0.1.0" and req["peer_pid"] == p.pid
    r = daemon.x4ctl("cancel", str(req["server_request_id"]))
    assert r.returncode == 0, r.stderr
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    done = json.loads(out.splitlines()[-1])
    assert done["finish_reason"] == "cancelled"
    assert done["server_request_id"] == req["server_request_id"]
    s = daemon.stats()
    assert s["cache_pages_used"] == 0 and s["requests_running"] == 0
    assert s["requests_cancelled"] == before["requests_cancelled"] + 1


def test_ctrl_c_cancels_and_exits_130(daemon):
    p, s, _ = start_long(daemon)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert json.loads(out.splitlines()[-1])["finish_reason"] == "cancelled"
    assert daemon.stats()["cache_pages_used"] == 0


# ---- the C client --------------------------------------------------------------------------------

def run_client(client_test, daemon, *args):
    r = subprocess.run([client_test, daemon.sock, *args], capture_output=True, text=True, timeout=120)
    facts = {}
    for line in r.stdout.splitlines():
        k, _, v = line.partition(" ")
        facts[k] = v
    return r, facts


def test_c_client_blocking_matches_x4ctl(daemon, client_test):
    r, f = run_client(client_test, daemon, "blocking", "10")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f["server"] == "xing4d 0.1.0"
    _, lines = gen_json(daemon, "--tokens", "5,6,7,8,9", "--temperature", "0", "--max-tokens", "10")
    ids = [i for x in lines if x["type"] == "chunk" for i in x["token_ids"]]
    assert f["ids"] == ",".join(map(str, ids))
    assert int(f["completion_tokens"]) == len(ids) and int(f["prompt_tokens"]) == 5


def test_c_client_event_loop_runs_requests_concurrently(daemon, client_test):
    r, f = run_client(client_test, daemon, "concurrent", "3", "16")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f["pending"] == "3"
    # batched together, each request's greedy output is what it would be alone (docs/design.md
    # "Numerics": a sequence does not depend on its batch-mates)
    _, alone = run_client(client_test, daemon, "blocking", "16")
    for i in range(3):
        assert f[f"ids{i}"] == alone["ids"]
        done_count, finish, n = f[f"done{i}"].split()
        assert done_count == "1"  # exactly one end per request


def test_c_client_cancel_from_callback(daemon, client_test):
    r, f = run_client(client_test, daemon, "cancel-after", "5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f["status"] == "0" and f["finish"] == "3"  # X4_FINISH_CANCELLED
    assert int(f["chunks"]) == 5  # no chunk is delivered after the callback asked to stop
    assert f["stats"] == "0" and f["pages_used"] == "0" and f["running"] == "0"


def model_with_template(tmp_path, template):
    """A copy of the fixture model whose tokenizer.chat_template is `template` (padded with a
    Jinja comment to the original's length, so no offset in the file moves)."""
    from conftest import MODEL
    data = bytearray(MODEL.read_bytes())
    key = b"tokenizer.chat_template"
    at = data.find(key) + len(key)
    n = struct.unpack("<Q", data[at + 4:at + 12])[0]
    assert len(template) + 4 <= n
    t = (template + "{#" + " " * (n - len(template) - 4) + "#}").encode()
    data[at + 12:at + 12 + n] = t
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.gguf").write_bytes(bytes(data))
    (d / "config.json").write_bytes((MODEL.parent / "config.json").read_bytes())
    return d / "model.gguf"


def test_c_client_sends_tool_call_history(fresh_daemon, client_test, tmp_path):
    # a template that shows what it is given: the assistant's earlier tool call and reasoning
    # and the tool's name must reach it
    model = model_with_template(
        tmp_path, "{% for m in messages %}{{ m.role }}{{ m.reasoning_content }}{% if m.tool_calls %}"
        "{{ m.tool_calls|tojson }}{% endif %}{{ m.name }}{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<_bot><think>\n{% endif %}")
    daemon = fresh_daemon(args=("--model", str(model)))
    calls = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    r, with_calls = run_client(client_test, daemon, "tool-history", calls)
    assert with_calls["status"] == "0", r.stdout + r.stderr
    r, without = run_client(client_test, daemon, "tool-history", "-")
    assert without["status"] == "0", r.stdout + r.stderr
    assert int(with_calls["prompt_tokens"]) > int(without["prompt_tokens"]) + 5
    # a broken tool call is refused naming the field
    r, bad = run_client(client_test, daemon, "tool-history", '[{"name": ')
    assert bad["status"] == "-1"
    assert bad["message"].startswith("prompt.chat.messages[1].tool_calls_json"), bad


def greedy_body(prompt_field, max_tokens=6):
    sampling = w.varint(1 << 3 | 5) + struct.pack("<f", 0.0)
    return prompt_field + w.field_bytes(4, sampling) + w.field_varint(5, max_tokens) + w.field_varint(11, 1)


def chat_field(messages, add_generation_prompt=None):
    """messages: (role, content) or (role, content, tool_calls_json)"""
    chat = b"".join(w.field_bytes(1, w.field_bytes(1, m[0]) + w.field_bytes(2, m[1]) +
                                 (w.field_bytes(4, m[2]) if len(m) > 2 else b"")) for m in messages)
    if add_generation_prompt is not None:
        chat += w.field_varint(4, int(add_generation_prompt))
    return w.field_bytes(3, chat)


def test_chat_without_generation_prompt_continues_the_assistant(fresh_daemon, tmp_path):
    # Chat.add_generation_prompt = false (it was ignored): a final assistant message is left open
    # and the answer continues it, token for token what the raw text up to it gives
    model = model_with_template(tmp_path, "{% for m in messages %}{{ m.role }}: {{ m.content }}"
                                          "{% if m.tool_calls %} calls {{ m.tool_calls[0].name }}{% endif %}{{ '\\n' }}{% endfor %}"
                                          "{% if add_generation_prompt %}assistant: {% endif %}")
    d = fresh_daemon(args=("--model", str(model)))
    history = [("user", "hi"), ("assistant", "Once upon")]
    with_call = [("user", "hi"), ("assistant", "Once upon", '[{"name": "f", "arguments": {}}]')]
    c = w.Conn(d.sock)
    c.hello()
    got, done = c.generate_all([greedy_body(chat_field(history, False)),
                                greedy_body(w.field_bytes(1, "user: hi\nassistant: Once upon")),
                                greedy_body(chat_field(history)),
                                greedy_body(chat_field(with_call, False)),
                                greedy_body(w.field_bytes(1, "user: hi\nassistant: Once upon calls f\n"))])
    c.close()
    usage = {k: w.parse(d[2][0]) for k, d in done.items()}
    assert got[1] == got[2] and len(got[1]) == 6
    assert usage[1][1] == usage[2][1]
    # the default (and true) renders the assistant's turn closed, then a new generation prompt
    assert usage[3][1][0] > usage[1][1][0]
    # an assistant message with tool calls is not cut open (the calls would be lost): it is
    # rendered whole, without a generation prompt
    assert got[4] == got[5] and usage[4][1] == usage[5][1]


def test_continuation_needs_a_template_that_keeps_the_text(fresh_daemon, tmp_path):
    # a template that changes message text cannot be continued from: refused, not guessed
    model = model_with_template(tmp_path, "{% for m in messages %}{{ m.role }}{{ m.content | upper }}{% endfor %}"
                                          "{% if add_generation_prompt %}<_bot><think>\n{% endif %}")
    d = fresh_daemon(args=("--model", str(model)))
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.frame(1, w.GENERATE, greedy_body(chat_field([("user", "hi"), ("assistant", "So")], False))))
    code, msg = w.error_of(c.recv())
    assert code == "INVALID_ARGUMENT"
    assert "does not render the final assistant message's content as given" in msg
    # an ordinary chat through the same template is served
    c.send(w.frame(2, w.GENERATE, greedy_body(chat_field([("user", "hi")]))))
    got, done = {2: []}, {}
    while 2 not in done:
        c.recv_generation(got, done)
    c.close()


def test_c_client_reports_server_errors(daemon, client_test):
    r, f = run_client(client_test, daemon, "bad-top-p")
    assert f["status"] == "-1 invalid argument"
    assert f["message"] == "sampling.top_p: 1.5 is out of range (0, 1]"
    assert f["health"] == "0"


# ---- shutdown --------------------------------------------------------------------------------------

def test_sigterm_when_idle_exits_0(fresh_daemon):
    d = fresh_daemon()
    assert d.terminate() == 0
    assert any("STOPPING=1" in m.split("\n") for m in d.messages)


def test_sigterm_drains_then_cancels_after_the_grace_period(fresh_daemon):
    d = fresh_daemon(args=("--grace", "1"))
    p, s, _ = start_long(d)
    d.proc.send_signal(signal.SIGTERM)
    d.wait_notify("STOPPING=1", timeout=30)
    # while draining: health says so, and new work is refused with a reason
    r = d.x4ctl("health")
    assert r.returncode == 6 and r.stdout.startswith("draining")
    r = d.x4ctl("generate", "--tokens", PROMPT)
    assert r.returncode == 6
    assert r.stderr == "x4ctl: the daemon is shutting down and accepts no new requests\n"
    # the running request is cancelled once the grace period is over, then the daemon exits 0
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["finish_reason"] == "cancelled"
    assert d.proc.wait(timeout=30) == 0


def test_sighup_is_ignored_not_fatal(fresh_daemon):
    # SIGHUP's default action killed the daemon mid-generation and left its socket file behind;
    # "reload" habits (kill -HUP, a closed terminal) must not take the service down
    d = fresh_daemon()
    p, s, _ = start_long(d)
    d.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while not any("SIGHUP ignored" in x for x in d.log):
        assert time.monotonic() < deadline and d.proc.poll() is None, d.log[-5:]
        time.sleep(0.05)
    assert d.proc.poll() is None
    r = d.x4ctl("health")
    assert r.returncode == 0 and r.stdout.startswith("serving"), r.stderr
    # the generation in flight goes on
    r = d.x4ctl("cancel", str(s["requests"][0]["server_request_id"]))
    assert r.returncode == 0, r.stderr
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["finish_reason"] == "cancelled"
    assert d.terminate() == 0


# ---- text output: stop strings, reasoning channel, thinking budget -------------------------------

def content_text(lines):
    return "".join(x["text"] for x in lines if x["type"] == "chunk" and x["channel"] == "content")


def test_stop_string_cuts_the_output(daemon):
    args = ("--raw", "--temperature", "0", "--max-tokens", "30", "--ignore-eos", "hello world")
    r, lines = gen_json(daemon, *args)
    assert r.returncode == 0, r.stderr
    full = content_text(lines)
    # the fixture's greedy output is fixed: pick its first 3-letter ASCII alphanumeric run after
    # the start as the stop string
    import re
    m = re.search(r"[A-Za-z0-9]{3}", full[1:])
    assert m, f"greedy output has no ASCII run to stop on: {full!r}"
    stop = m.group(0)
    cut = full.index(stop)
    r, lines = gen_json(daemon, *args, "--stop", stop)
    assert r.returncode == 0, r.stderr
    assert content_text(lines) == full[:cut]
    done = lines[-1]
    assert done["finish_reason"] == "stop" and done["stop"] == stop


def test_thinking_budget_forces_the_end_of_reasoning(daemon):
    r, lines = gen_json(daemon, "--temperature", "0", "--max-tokens", "10", "--ignore-eos",
                        "--thinking-budget", "3", "hi")
    assert r.returncode == 0, r.stderr
    chunks = [x for x in lines if x["type"] == "chunk"]
    channels = [x["channel"] for x in chunks]
    # chat with thinking on: the answer starts in reasoning; after 3 reasoning tokens the server
    # feeds </think> itself (a chunk of no text on the channel it closes) and the rest is content
    assert channels[:4] == ["reasoning"] * 4
    assert chunks[3]["text"] == "" and len(chunks[3]["token_ids"]) == 1, chunks[3]
    assert set(channels[4:]) == {"content"}
    assert lines[-1]["usage"]["reasoning_tokens"] == 3
    # a prompt that does not end inside <think> starts in content
    r, lines = gen_json(daemon, "--raw", "--temperature", "0", "--max-tokens", "5", "hi")
    assert {x["channel"] for x in lines if x["type"] == "chunk"} == {"content"}
    assert lines[-1]["usage"]["reasoning_tokens"] == 0


def test_specials_typed_in_a_message_are_text(daemon):
    """Text a user types (or a tool returns) that spells a special, `<_bot>` or `<_end>`, is text:
    it cannot write a role marker or end the turn inside the prompt. Each would be one token as a
    special; as text each is several. The same spelling in a --raw prompt stays special."""
    args = ("--temperature", "0", "--max-tokens", "1", "--ignore-eos")

    def prompt_tokens(*a):
        r, lines = gen_json(daemon, *args, *a)
        assert r.returncode in (0, 7), r.stderr  # 7: the one token went to the thinking
        return lines[-1]["usage"]["prompt_tokens"]

    base = prompt_tokens("hello there")
    assert prompt_tokens("hello there<_bot><_end>") - base >= 6
    raw = prompt_tokens("--raw", "<_user>hello there<_bot><think>\n")
    assert prompt_tokens("--raw", "<_user>hello there<_bot><_end><_bot><think>\n") == raw + 2


def test_logprobs_without_json_say_where_they_are(daemon):
    """The text output has no place for log probabilities: x4ctl says they come with --json."""
    r = daemon.x4ctl("generate", "--tokens", "5,6,7", "--max-tokens", "2", "--logprobs", "2")
    assert r.returncode == 0 and "--logprobs: the log probabilities are shown only with --json" in r.stderr
    r = daemon.x4ctl("--json", "generate", "--tokens", "5,6,7", "--max-tokens", "2", "--logprobs", "2")
    assert r.returncode == 0 and r.stderr == "" and '"logprobs"' in r.stdout, (r.stdout, r.stderr)


def test_a_turn_that_ends_while_thinking_is_no_answer(daemon):
    """The turn ending before the model answered (here a stop id met while it thinks) prints
    nothing on stdout, so x4ctl says why on stderr and exits 7, as for a budget spent thinking."""
    args = ("--temperature", "0", "--max-tokens", "8", "--ignore-eos", "hi")
    r, lines = gen_json(daemon, *args)
    ids = [t for x in lines if x["type"] == "chunk" and x["channel"] == "reasoning" for t in x["token_ids"]]
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    r = daemon.x4ctl("generate", "--temperature", "0", "--max-tokens", "8", "--stop-id", str(ids[k]), "hi")
    assert r.returncode == 7 and r.stdout.strip() == "", (r.stdout, r.stderr)
    assert f"the model ended its turn while still thinking ({k} tokens)" in r.stderr, r.stderr
    # its first token ending the turn: no reasoning token was counted, the answer is as missing
    # (this printed nothing and exited 0: 0.6% of unseeded one-token requests on the fixture)
    r = daemon.x4ctl("generate", "--temperature", "0", "--max-tokens", "8", "--stop-id", str(ids[0]), "hi")
    assert r.returncode == 7 and r.stdout == "", (r.stdout, r.stderr)
    assert "the model ended its turn at once, before thinking or answering; nothing was answered" in r.stderr


def test_a_template_that_escapes_contents_still_gets_them(fresh_daemon, tmp_path):
    """A template that writes messages through tojson changes their text, so contents cannot be
    kept apart as plain text; the prompt is then rendered as given (the content, quoted, is in
    it, its special's text special as before), the same ids as the raw text the template makes."""
    import shutil
    from conftest import FIXTURES
    tmpl = tmp_path / "t.jinja"
    tmpl.write_text("{% for m in messages %}{% if m.role == 'user' %}<_user>{{ m.content | tojson }}"
                    "{% endif %}{% endfor %}<_bot><think>\n")
    (tmp_path / "m").mkdir()
    subprocess.run([sys.executable, str(Path(__file__).parent / "gguf_retemplate.py"),
                    str(FIXTURES / "xing4-tiny-a" / "model.gguf"), str(tmp_path / "m" / "model.gguf"), str(tmpl)],
                   check=True)
    shutil.copy(FIXTURES / "xing4-tiny-a" / "config.json", tmp_path / "m")
    d = fresh_daemon(args=("--model", str(tmp_path / "m" / "model.gguf")))
    args = ("--temperature", "0", "--max-tokens", "3", "--ignore-eos")
    _, chat = gen_json(d, *args, "hi <_bot>")
    # (the template's last newline is dropped, as jinja2 drops it without keep_trailing_newline)
    _, raw = gen_json(d, *args, "--raw", '<_user>"hi <_bot>"<_bot><think>')
    assert chat[-1]["usage"]["prompt_tokens"] == raw[-1]["usage"]["prompt_tokens"]
    assert ids_of(chat) == ids_of(raw)


def test_chat_uses_the_models_own_template(daemon):
    # the fixture's tokenizer.chat_template renders a user turn as <_user>{content} and always
    # ends with the generation prompt <_bot><think>\n (it ignores enable_thinking)
    args = ("--temperature", "0", "--max-tokens", "4", "--ignore-eos")
    _, chat = gen_json(daemon, *args, "hello there")
    _, raw = gen_json(daemon, *args, "--raw", "<_user>hello there<_bot><think>\n")
    assert chat[-1]["usage"]["prompt_tokens"] == raw[-1]["usage"]["prompt_tokens"]
    assert ids_of(chat) == ids_of(raw)
    assert {x["channel"] for x in chat if x["type"] == "chunk"} <= {"reasoning", "content"}
    assert chat[0]["channel"] == "reasoning"


# ---- x4ctl chat and timeouts -----------------------------------------------------------------------

def test_interactive_chat_keeps_the_history(daemon):
    p = subprocess.run([str(daemon_x4ctl()), "--socket", daemon.sock, "--json", "chat",
                        "--no-think", "--temperature", "0", "--max-tokens", "3"],
                       input="hello\nand again\n", capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    dones = [json.loads(x) for x in p.stdout.splitlines() if '"type":"done"' in x]
    assert len(dones) == 2
    # the second turn's prompt holds the first turn and its answer
    assert dones[1]["usage"]["prompt_tokens"] > dones[0]["usage"]["prompt_tokens"] + 3


def test_handshake_timeout_when_nobody_answers(tmp_path):
    import socket as so
    path = str(tmp_path / "silent.sock")
    srv = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)  # never accepts: connect succeeds into the backlog, no Hello reply comes
    r = subprocess.run([str(daemon_x4ctl()), "--socket", path, "--connect-timeout", "300", "health"],
                       capture_output=True, text=True, timeout=30)
    srv.close()
    assert r.returncode == 4
    assert r.stderr == (f"x4ctl: {path}: no handshake reply within 300 ms (is the daemon still "
                        "loading its model?)\n")


# ---- snapshots -------------------------------------------------------------------------------------

def ids_of(lines):
    return [i for x in lines if x["type"] == "chunk" for i in x["token_ids"]]


def test_an_empty_snapshot_list_says_so(daemon):
    # it printed nothing at all: a user could not tell an empty folder from a failure
    for x in json.loads(daemon.x4ctl("snapshot", "list", "--json").stdout):
        daemon.x4ctl("snapshot", "drop", x["name"])
    r = daemon.x4ctl("snapshot", "list")
    assert (r.returncode, r.stdout) == (0, "no snapshots (x4ctl snapshot create NAME PROMPT... makes one)\n")
    assert daemon.x4ctl("snapshot", "list", "--json").stdout == "[]\n"


def test_snapshot_resume_equals_the_full_prompt(daemon):
    r = daemon.x4ctl("snapshot", "create", "sys1", "--tokens", PROMPT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("sys1: 8 tokens, ")
    assert (daemon.state / "sys1.x4snap").exists()
    r = daemon.x4ctl("snapshot", "list", "--json")
    assert [x["name"] for x in json.loads(r.stdout)] == ["sys1"]
    assert json.loads(r.stdout)[0]["n_tokens"] == 8
    # resuming = the snapshot's 8 tokens are cached, only the new ones are prefilled, and the
    # output is what the whole prompt gives
    _, resumed = gen_json(daemon, "--tokens", "13,14", "--snapshot", "sys1", "--temperature", "0",
                          "--max-tokens", "6", "--ignore-eos")
    _, full = gen_json(daemon, "--tokens", PROMPT + ",13,14", "--temperature", "0",
                       "--max-tokens", "6", "--ignore-eos")
    assert ids_of(resumed) == ids_of(full) and len(ids_of(full)) == 6
    usage = resumed[-1]["usage"]
    assert (usage["prompt_tokens"], usage["cached_tokens"]) == (10, 8)
    assert full[-1]["usage"]["cached_tokens"] == 0
    r = daemon.x4ctl("snapshot", "drop", "sys1")
    assert r.returncode == 0, r.stderr
    assert not (daemon.state / "sys1.x4snap").exists()
    r = daemon.x4ctl("snapshot", "drop", "sys1")
    assert r.returncode == 5
    assert r.stderr == f"x4ctl: snapshot 'sys1': not found in {daemon.state}\n"
    r = daemon.x4ctl("generate", "--tokens", "13", "--snapshot", "sys1")
    assert r.returncode == 5
    assert r.stderr == f"x4ctl: snapshot 'sys1': not found in {daemon.state}\n"


def test_snapshot_create_refuses_an_existing_name_unless_replace(daemon):
    r = daemon.x4ctl("snapshot", "create", "keep", "--tokens", PROMPT)
    assert r.returncode == 0, r.stderr
    before = (daemon.state / "keep.x4snap").read_bytes()
    # a second create under the same name: refused before any prefill, naming the snapshot and
    # the way out; the first one is left as it was
    r = daemon.x4ctl("snapshot", "create", "keep", "--tokens", "5,6,7")
    assert r.returncode == 8, (r.returncode, r.stderr)
    assert r.stderr == (f"x4ctl: snapshot 'keep': already exists in {daemon.state}; drop it first, or ask "
                        "to replace it (x4ctl snapshot create --replace)\n"), r.stderr
    assert (daemon.state / "keep.x4snap").read_bytes() == before
    assert not list(daemon.state.glob("*.tmp"))
    # the protocol says so too: a SnapshotRequest without replace gets ERROR_ALREADY_EXISTS
    c = w.Conn(daemon.sock)
    c.hello()
    req = w.field_varint(1, 1) + w.field_bytes(2, "keep") + w.field_bytes(4, w.field_bytes(1, b"".join(w.varint(i) for i in (5, 6, 7))))
    c.send(w.frame(7, w.SNAPSHOT, req))
    code, msg = w.error_of(c.recv())
    assert code == "ALREADY_EXISTS" and "snapshot 'keep': already exists" in msg, (code, msg)
    c.close()
    # --replace (SnapshotRequest.replace) replaces it
    r = daemon.x4ctl("snapshot", "create", "--replace", "keep", "--tokens", "5,6,7")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("keep: 3 tokens, "), r.stdout
    r = daemon.x4ctl("snapshot", "list", "--json")
    assert [(x["name"], x["n_tokens"]) for x in json.loads(r.stdout)] == [("keep", 3)]
    assert daemon.x4ctl("snapshot", "drop", "keep").returncode == 0


def test_snapshot_of_another_model_is_refused(daemon):
    r = daemon.x4ctl("snapshot", "create", "fp", "--tokens", PROMPT)
    assert r.returncode == 0, r.stderr
    path = daemon.state / "fp.x4snap"
    data = bytearray(path.read_bytes())
    # the header's fingerprint field starts at byte 40 (proto/../daemon/scheduler.c snap_header)
    data[40:44] = b"ffff"
    path.write_bytes(bytes(data))
    r = daemon.x4ctl("generate", "--tokens", "13", "--snapshot", "fp")
    assert r.returncode == 1
    assert "snapshot 'fp': made with model ffff" in r.stderr
    assert "this daemon serves" in r.stderr
    path.unlink()


# ---- configuration, limits, watchdog ---------------------------------------------------------------

def run_xing4d(*args, timeout=60):
    from conftest import XING4D, MODEL
    return subprocess.run([str(XING4D), "--model", str(MODEL), "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_no_socket_is_said_before_the_model_loads(tmp_path):
    # neither socket-activated nor --listen: refused at once, not after loading the model (which
    # takes minutes for the release's); the log has nothing from the load
    r = run_xing4d("--config", "/dev/null", "--state-dir", str(tmp_path))
    assert r.returncode == 1
    assert "no socket: not socket-activated and no --listen PATH given" in r.stderr
    assert "chat template" not in r.stderr and "serving" not in r.stderr, r.stderr


def test_unusable_listen_paths_are_said_before_the_model_loads(tmp_path):
    # each was found only at bind(), after the model load; a regular file there was reported as
    # "Address already in use"
    (tmp_path / "notes.txt").write_text("keep me\n")
    cases = [
        (tmp_path / "missing" / "x.sock", f"the folder {tmp_path / 'missing'} does not exist"),
        (tmp_path / ("s" * 120), "longer than 107 bytes"),
        (tmp_path / "notes.txt", "exists and is not a socket (not replaced: choose another path)"),
        (tmp_path, "exists and is not a socket"),
    ]
    for path, message in cases:
        r = run_xing4d("--config", "/dev/null", "--listen", str(path), "--state-dir", str(tmp_path))
        assert r.returncode == 1 and f"--listen {path}: {message}" in r.stderr, r.stderr
        assert "chat template" not in r.stderr and "serving" not in r.stderr, r.stderr
    assert (tmp_path / "notes.txt").read_text() == "keep me\n"


def test_empty_path_settings_mean_the_default(fresh_daemon, tmp_path):
    # the packaged file shows "#listen =" and "#config-json =": uncommented as they are, the empty
    # listen path was bound as an abstract socket nobody can reach while the daemon said it served
    conf = tmp_path / "empty.conf"
    conf.write_text("[xing4d]\nlisten =\nconfig-json =\ntokenizer-path =\n")
    r = run_xing4d("--config", str(conf), "--state-dir", str(tmp_path))
    assert r.returncode == 1
    assert "no socket: not socket-activated and no --listen PATH given" in r.stderr, r.stderr
    from conftest import DEFAULT_CONF
    d = fresh_daemon(conf=DEFAULT_CONF + "listen =\nconfig-json =\ntokenizer-path =\n")
    r = d.x4ctl("health")
    assert r.returncode == 0 and r.stdout.startswith("serving"), r.stderr


def test_config_json_may_name_its_folder(fresh_daemon, tmp_path):
    """--config-json takes the file or the folder holding it (the packaged xing4d.conf says so); a
    folder without one is named as such."""
    from conftest import DEFAULT_CONF, FIXTURES
    folder = FIXTURES / "xing4-tiny-a"
    d = fresh_daemon(conf=DEFAULT_CONF, args=("--config-json", str(folder)))
    assert d.x4ctl("health").returncode == 0
    empty = tmp_path / "nothing"
    empty.mkdir()
    r = run_xing4d("--config", "/dev/null", "--config-json", str(empty), "--listen", str(tmp_path / "s.sock"),
                   "--state-dir", str(tmp_path))
    assert r.returncode == 1 and f"config.json: the folder {empty} holds no config.json" in r.stderr, r.stderr


def test_config_errors_name_the_line(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text("[xing4d]\nthreads = 1\nfrobnicate = yes\n")
    r = run_xing4d("--config", str(conf), "--listen", str(tmp_path / "s.sock"))
    assert r.returncode == 1
    assert f"{conf}:3: unknown setting 'frobnicate'" in r.stderr
    conf.write_text("max-running = lots\n")
    r = run_xing4d("--config", str(conf))
    assert r.returncode == 1
    assert f"{conf}:1: 'lots' is not an integer in [1, 4096]" in r.stderr
    # a misspelt section header: its settings would be dropped without a word
    conf.write_text("[xing4]\nmax-running = 2\n[xing4d]\nthreads = 1\n")
    r = run_xing4d("--config", str(conf))
    assert f"{conf}:1: section [xing4] is not [xing4d]: the settings under it are ignored" in r.stderr
    assert "section [xing4d]" not in r.stderr
    # a bad value on a config line names the setting, not only the line
    conf.write_text("[xing4d]\nthreads = 1\nmax_running = lots\n")
    r = run_xing4d("--config", str(conf))
    assert r.returncode == 1
    assert f"{conf}:3: 'lots' is not an integer in [1, 4096] (setting 'max-running')" in r.stderr
    conf.write_text("[xing4d]\nmemory-limit = much\n")
    r = run_xing4d("--config", str(conf))
    assert r.returncode == 1
    assert f"{conf}:2: 'much' is not a size (e.g. 8G, 512M) (setting 'memory-limit')" in r.stderr
    # a line longer than the parser's buffer is an error, not two lines
    conf.write_text("[xing4d]\nthreads = 1\n# " + "x" * 5000 + "\n")
    r = run_xing4d("--config", str(conf))
    assert r.returncode == 1
    assert f"{conf}:3: line longer than 4095 bytes" in r.stderr
    # 4095 bytes exactly, at the end of the file without a newline, still fits
    conf.write_text("[xing4d]\n#" + "x" * 4094)
    r = run_xing4d("--config", str(conf))
    assert "line longer" not in r.stderr and f"{conf}:" not in r.stderr, r.stderr
    r = run_xing4d("--config", str(tmp_path / "missing.conf"))
    assert r.returncode == 1
    assert f"config {tmp_path / 'missing.conf'}: cannot open: No such file or directory" in r.stderr
    r = run_xing4d("--config", "/dev/null", "--device", "tpu")
    assert r.returncode == 1 and "--device: device 'tpu', one of cpu, cuda, auto expected" in r.stderr
    # neither socket activation nor --listen: nothing to serve on
    r = run_xing4d("--config", "/dev/null")
    assert r.returncode == 1
    assert "no socket: not socket-activated and no --listen PATH given" in r.stderr


def test_flags_override_the_config_and_frame_limit(fresh_daemon):
    d = fresh_daemon(args=("--max-running", "2", "--max-frame", "2048"))
    info = json.loads(d.x4ctl("info", "--json").stdout)
    assert info["max_running"] == 2  # the config file says 4
    assert info["max_frame"] == 2048
    # 1500 token ids (2 bytes each as varints) do not fit 2 KiB: the client refuses before sending, naming both sizes
    r = d.x4ctl("generate", "--tokens", ",".join(["300"] * 1500))
    assert r.returncode == 1
    assert "exceeds the server's frame limit of 2048 bytes" in r.stderr
    # a raw client that sends it anyway gets TOO_LARGE and is disconnected
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.frame(9, w.GENERATE, w.generate_tokens([300] * 1500)))
    assert w.error_of(c.recv())[0] == "TOO_LARGE"
    assert c.closed_by_server()


def test_watchdog_pings_come_from_the_loop(fresh_daemon):
    # as under WatchdogSec=: the daemon pings from its event loop at half the interval
    d = fresh_daemon(env=("WATCHDOG_USEC=200000",))
    d.wait_notify("WATCHDOG=1", timeout=10)
    assert d.terminate() == 0


def test_a_client_that_does_not_read_is_paused_not_buffered(fresh_daemon):
    # 16 KiB of queued output: each chunk with 20 logprobs is a few hundred bytes, so a client
    # that stops reading fills the socket buffer and then this within about a thousand tokens
    d = fresh_daemon(args=("--output-buffer", "16K"))
    c = w.Conn(d.sock)
    c.hello()
    # logprobs 20 (field 9), ignore_eos (field 11)
    req = (w.generate_tokens([5, 6, 7], max_tokens=100000, temperature=0.0) + w.field_varint(9, 20)
           + w.field_varint(11, 1))
    c.send(w.frame(1, w.GENERATE, req))
    s = d.wait_stats(lambda s: s["requests"] and s["requests"][0]["paused"], timeout=120,
                     what="the request paused")
    n1 = s["requests"][0]["completion_tokens"]
    assert n1 < 64 * 256 - 3  # paused well before the context limit
    # paused means no decode steps: the count stays put while nobody reads
    assert d.stats()["requests"][0]["completion_tokens"] == n1
    # reading resumes it: more chunks come than had been generated when it paused
    for _ in range(n1 + 50):
        f = c.recv()
        assert w.CHUNK in f, f
    c.send(w.frame(1, w.CANCEL))
    while True:
        f = c.recv()
        if w.DONE in f:
            break
    done = w.parse(f[w.DONE][0])
    assert done[1] == [3]  # FINISH_CANCELLED
    assert w.parse(done[2][0])[3][0] >= n1 + 50  # usage.completion_tokens
    assert d.stats()["cache_pages_used"] == 0


def test_a_client_pauses_one_request_and_not_the_others(fresh_daemon):
    # Pause (protocol 1.6): the client's own back-pressure on one request, as a bridge relaying
    # many clients over one connection needs; its other requests go on
    d = fresh_daemon()
    c = w.Conn(d.sock)
    c.hello()
    req = w.generate_tokens([5, 6, 7], max_tokens=100000, temperature=0.0, ignore_eos=True)
    c.send(w.frame(1, w.GENERATE, req))
    d.wait_stats(lambda s: s["requests"] and s["requests"][0]["completion_tokens"] > 0,
                 what="the request running")
    c.send(w.frame(1, w.PAUSE, w.field_varint(1, 1)))
    s = d.wait_stats(lambda s: s["requests"][0]["paused"], what="the request paused")
    n1 = s["requests"][0]["completion_tokens"]
    time.sleep(0.3)
    assert d.stats()["requests"][0]["completion_tokens"] == n1  # no decode steps while paused
    # another request on the same connection runs to its end meanwhile
    c.send(w.frame(2, w.GENERATE, w.generate_tokens([8, 9], max_tokens=4, ignore_eos=True)))
    while True:
        f = c.recv()
        if w.DONE in f and f[1] == [2]:
            break
    c.send(w.frame(1, w.PAUSE, w.field_varint(1, 0)))
    s = d.wait_stats(lambda s: not s["requests"][0]["paused"] and s["requests"][0]["completion_tokens"] > n1,
                     what="the request resumed")
    # an unknown request is ignored, not an error: the connection goes on
    c.send(w.frame(77, w.PAUSE, w.field_varint(1, 1)))
    c.send(w.frame(1, w.CANCEL))
    while True:
        f = c.recv()
        assert w.ERROR not in f, f
        if w.DONE in f and f[1] == [1]:
            break


def test_c_client_snapshots_a_finished_request(daemon, client_test):
    r, f = run_client(client_test, daemon, "snapshot-from", "conv1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f["first"] == "0 4"
    # the snapshot holds the request's 5 prompt tokens and its 4 generated ones
    assert f["snapshot"] == "0 conv1 9"
    assert f["resumed"] == "0 cached 9 prompt 10"
    assert f["resumed_ids"] == f["full_ids"] and len(f["full_ids"].split(",")) == 6
    assert f["missing"] == ("SnapshotRequest.from_request: request 999 is not one of the last 4 "
                            "finished on this connection")
    assert daemon.x4ctl("snapshot", "drop", "conv1").returncode == 0


def _tiny_page_bytes():
    """Bytes of one 256-token cache page of the fixture model (spec: every layer's 576-wide
    row in the release; here kv_lora_rank + qk_rope_head_dim floats)."""
    cfg = json.loads((MODEL.parent / "config.json").read_text())
    return cfg["num_hidden_layers"] * 256 * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4


@pytest.mark.parametrize("how", ["--memory-limit", "--gpu-memory-limit", "gpu-memory-limit ="])
def test_memory_limit_sizes_the_cache(fresh_daemon, how):
    """The memory limit (either name, on the command line or in the config file) is what the
    backend plans the cache against: the model file plus 3.5 pages leaves room for 3 pages."""
    limit = MODEL.stat().st_size + int(3.5 * _tiny_page_bytes())
    conf = "[xing4d]\npage-tokens = 256\n"
    if how.endswith("="):
        d = fresh_daemon(conf + f"{how} {limit}\n")
    else:
        d = fresh_daemon(conf, args=(how, str(limit)))
    assert d.stats()["cache_pages_total"] == 3


def test_gpu_memory_limit_refuses_a_bad_size(fresh_daemon, tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text("[xing4d]\n")
    r = subprocess.run([str(XING4D), "--config", str(conf), "--model", str(MODEL),
                        "--device", "cpu", "--gpu-memory-limit", "12Q"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--gpu-memory-limit: '12Q' is not a size (e.g. 8G, 512M)" in r.stderr
