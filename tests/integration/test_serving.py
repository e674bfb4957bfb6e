# SPDX-License-Identifier: MIT
"""What continuous batching and the prefix store promise a user: a request's greedy tokens do not
depend on what runs beside it, a repeated long prompt is served from cached pages (fewer prompt
tokens computed, a shorter prefill) with the very same output, and bad frames are refused one by
one while the daemon keeps serving."""
import struct
import time

import pytest

import x4wire as w
from conftest import DEFAULT_CONF, N_VOCAB


def ids_of(lines):
    return [i for x in lines if x["type"] == "chunk" for i in x["token_ids"]]


def gen(daemon, ids, *args):
    import json
    r = daemon.x4ctl("--json", "generate", "--tokens", ",".join(map(str, ids)),
                     "--temperature", "0", "--ignore-eos", *args)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[-1]["type"] == "done"
    return ids_of(lines), lines[-1]


def prompt(seed, n):
    """n token ids, a different sequence per seed (avoiding the low special ids)."""
    return [5 + (seed * 131 + i * 17 + (i * i) % 7) % (N_VOCAB - 5) for i in range(n)]


# ---- continuous batching ---------------------------------------------------------------------------

def test_sixteen_concurrent_requests_give_what_each_gives_alone(fresh_daemon):
    d = fresh_daemon(DEFAULT_CONF.replace("max-running = 4", "max-running = 16"))
    prompts = [prompt(k, 3 + 11 * k) for k in range(16)]  # 3 .. 168 tokens
    c = w.Conn(d.sock, timeout=120)
    c.hello()
    # one write: all 16 are queued together, so they run side by side
    got, _ = c.generate_all(w.generate_tokens(p, max_tokens=24, temperature=0.0, ignore_eos=True)
                            for p in prompts)
    c.close()
    s = d.stats()
    # batching is visible: forwards held several requests at once
    assert s["engine_steps_batched"] > 0 and s["batch_max"] > 1, s
    for k, p in enumerate(prompts):
        alone, _ = gen(d, p, "--max-tokens", "24")
        assert len(alone) == 24
        assert got[k + 1] == alone, f"request {k} ({len(p)} prompt tokens) differs in a batch"


# ---- prefix store -----------------------------------------------------------------------------------

PREFIX_CONF = "[xing4d]\ncache-pages = 32\npage-tokens = 64\nmax-running = 4\n"


def test_repeated_long_prompt_reuses_cached_pages(fresh_daemon):
    d = fresh_daemon(PREFIX_CONF)
    a = prompt(1, 650)
    before = d.stats()
    first, done1 = gen(d, a, "--max-tokens", "8")
    assert done1["usage"]["cached_tokens"] == 0
    second, done2 = gen(d, a, "--max-tokens", "8")
    # 10 full pages of 64 tokens come from the store; 10 tokens are computed
    assert done2["usage"]["prompt_tokens"] == 650
    assert done2["usage"]["cached_tokens"] == 640
    # reused pages give exactly the output of computing them
    assert second == first and len(first) == 8
    # faster: the daemon's own prefill time (not wall time of a busy machine)
    assert done2["timings"]["prefill_ms"] < done1["timings"]["prefill_ms"], (done1, done2)
    s = d.stats()
    assert s["prefix_hits"] == before["prefix_hits"] + 1
    assert s["prefix_tokens_reused"] == before["prefix_tokens_reused"] + 640
    assert s["prefix_misses"] >= before["prefix_misses"] + 1
    # the store keeps pages, but no request holds any now
    assert s["prefix_pages"] >= 10 and s["cache_pages_used"] == 0


def test_shared_head_reuses_whole_pages_only_and_matches_a_cold_daemon(fresh_daemon):
    a = prompt(2, 400)
    b = a[:300] + prompt(3, 120)  # shares 4 full pages (256 tokens) and part of a fifth
    cold = fresh_daemon(PREFIX_CONF)
    ref, done = gen(cold, b, "--max-tokens", "6")
    assert done["usage"]["cached_tokens"] == 0
    warm = fresh_daemon(PREFIX_CONF)
    gen(warm, a, "--max-tokens", "6")
    out, done = gen(warm, b, "--max-tokens", "6")
    assert done["usage"]["cached_tokens"] == 256  # the partial fifth page is recomputed
    assert out == ref


def test_stored_pages_are_evicted_when_admission_needs_them(fresh_daemon):
    d = fresh_daemon(PREFIX_CONF)  # 32 pages of 64 tokens
    a, b = prompt(4, 1100), prompt(5, 1100)
    out_a, _ = gen(d, a, "--max-tokens", "8")
    s = d.stats()
    assert s["prefix_pages"] == 17 and s["cache_pages_used"] == 0
    # b needs 18 pages, 15 are free: the store gives back its least recently used pages
    out_b, done = gen(d, b, "--max-tokens", "8")
    assert done["usage"]["cached_tokens"] == 0 and len(out_b) == 8
    s = d.stats()
    assert s["prefix_pages"] <= 32 and s["cache_pages_used"] == 0
    # a's head was partly evicted (leaves first): what is left is still reused, same output
    again, done = gen(d, a, "--max-tokens", "8")
    assert again == out_a
    assert done["usage"]["cached_tokens"] % 64 == 0 and done["usage"]["cached_tokens"] < 1088


# ---- bad frames: each refused with its message, then the next request is served -----------------

def drain(c):
    """Reads the frames of the request in flight up to its DONE; none may be an error."""
    while True:
        f = c.recv()
        assert f is not None and w.ERROR not in f, f
        if w.DONE in f:
            return


def serves_next(d):
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.frame(1, w.GENERATE, w.generate_tokens([5, 6, 7], max_tokens=3, temperature=0.0)))
    drain(c)
    c.close()


def test_truncated_frame_closes_that_connection_only(daemon):
    c = w.Conn(daemon.sock)
    c.hello()
    payload = w.frame(1, w.GENERATE, w.generate_tokens([5, 6, 7], max_tokens=3))
    c.send_raw(struct.pack(">I", len(payload)) + payload[:len(payload) // 2])
    c.s.shutdown(1)  # the client's end of the stream arrives mid-frame
    f = c.recv()
    assert f is None or w.ERROR in f
    c.close()
    serves_next(daemon)


def test_unknown_message_is_refused_and_the_connection_kept(daemon):
    c = w.Conn(daemon.sock)
    c.hello()
    c.send(w.frame(9, 99, b"\x08\x01"))  # a body field this server does not know
    assert w.error_of(c.recv()) == ("PROTOCOL",
                                    "frame has no body (or one this server does not know)")
    c.send(w.frame(3, w.GENERATE, w.generate_tokens([5, 6], max_tokens=2, temperature=0.0)))
    drain(c)
    c.close()
    serves_next(daemon)


@pytest.mark.parametrize("name,send,expect", [
    ("oversized", lambda c: c.send_raw(struct.pack(">I", 0x7FFFFFFF)), "TOO_LARGE"),
    ("garbage", lambda c: c.send(b"\xff\xfe\xfd\xfc"), "PROTOCOL"),
    ("version", None, "VERSION_MISMATCH"),
    ("sampling", lambda c: c.send(w.frame(
        2, w.GENERATE, w.generate_tokens([5, 6], temperature=float("nan")))), "INVALID_ARGUMENT"),
    ("context", lambda c: c.send(w.frame(
        2, w.GENERATE, w.generate_tokens([5] * (64 * 256)))), "TOO_LARGE"),
])
def test_each_bad_input_then_the_next_request_is_served(daemon, name, send, expect):
    c = w.Conn(daemon.sock)
    if name == "version":
        c.send(w.frame(0, w.HELLO, w.hello(major=7)))
    else:
        c.hello()
        send(c)
    code, msg = w.error_of(c.recv())
    assert code == expect and msg, msg
    c.close()
    serves_next(daemon)


# ---- snapshots -------------------------------------------------------------------------------------

def test_cancelled_snapshot_create_ends_with_an_error_and_saves_nothing(fresh_daemon):
    d = fresh_daemon(DEFAULT_CONF.replace("cache-pages = 64", "cache-pages = 256").replace(
        "page_tokens = 256", "page_tokens = 64"))
    c = w.Conn(d.sock, timeout=120)
    c.hello()
    toks = b"".join(w.varint(5 + i % 400) for i in range(12000))
    create = w.field_varint(1, 1) + w.field_bytes(2, "big") + w.field_bytes(4, w.field_bytes(1, toks))
    # create and cancel in one write: the cancel arrives while the prompt is queued or prefilling
    c.send_raw(b"".join(struct.pack(">I", len(f)) + f
                        for f in (w.frame(4, 16, create), w.frame(4, w.CANCEL))))
    f = c.recv()
    assert w.DONE not in f, "a snapshot request must not end with a bare Done"
    if w.ERROR in f:
        assert w.error_of(f) == ("UNAVAILABLE",
                                 "snapshot 'big': cancelled before it was saved (nothing written)")
        assert not (d.state / "big.x4snap").exists()
    else:  # it was saved before the cancel was seen: a proper reply
        assert 17 in f, f
    c.close()
    s = d.wait_stats(lambda s: not s["requests"], what="the snapshot request ending")
    assert s["cache_pages_used"] == 0
    assert not any(p.name.endswith(".tmp") for p in d.state.iterdir())


def test_device_auto_says_which_backend_and_why(fresh_daemon):
    import re
    d = fresh_daemon(args=("--device", "auto"))
    # the line comes before READY=1, but the thread that reads the daemon's stderr may not
    # have taken it yet when READY arrives over the notify socket
    deadline = time.monotonic() + 10
    while not any("device auto:" in x for x in d.log) and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [x for x in d.log if "device auto:" in x]
    assert len(lines) == 1, d.log
    assert re.search(r"device auto: (cuda (module not loadable|backend failed to start): .+; "
                     r"using cpu|cuda module loaded and started; using cuda)$", lines[0]), lines
    assert d.x4ctl("health").returncode == 0


def test_load_progress_counts_up_to_100_before_ready(fresh_daemon):
    import re
    d = fresh_daemon()
    statuses = [line for m in d.messages for line in m.split("\n")]
    pcts = [int(x.group(1)) for x in (re.match(r"STATUS=loading (\d+)% \((.+)\)$", s)
                                      for s in statuses) if x]
    # the weights are read in chunks (0..50%), then the backend takes them (..100%)
    assert len(pcts) >= 10, statuses
    assert pcts == sorted(pcts) and pcts[-1] == 100 and pcts[0] < 50, pcts
    assert any("(reading weights)" in s for s in statuses)
    assert statuses.index(next(s for s in statuses if s.startswith("STATUS=loading 100%"))) < \
        statuses.index("READY=1")


def test_a_client_killed_mid_stream_frees_its_pages(fresh_daemon):
    import signal
    d = fresh_daemon()
    p = d.x4ctl_popen("--json", "generate", "--tokens", "5,6,7,8", "--ignore-eos",
                      "--max-tokens", "100000")
    s = d.wait_stats(lambda s: s["requests_running"] == 1 and s["requests"]
                     and s["requests"][0]["completion_tokens"] > 0,
                     what="the request streaming")
    assert 1 <= s["cache_pages_used"] < 64  # taken as the sequence grows
    p.send_signal(signal.SIGKILL)  # no Cancel frame: only the socket closing tells the daemon
    p.wait(timeout=30)
    # the engine ends it and frees its pages in one step; wait for that step's stats (the
    # hang-up reaches the engine some time after the kill on a loaded machine)
    s = d.wait_stats(lambda s: not s["requests"] and s["requests_cancelled"] == 1,
                     what="the request cancelled")
    assert s["cache_pages_used"] == 0, s
    # and a new request is served at once
    p = d.x4ctl_popen("--json", "generate", "--tokens", "9,8,7", "--ignore-eos",
                      "--max-tokens", "100000")
    s = d.wait_stats(lambda s: s["requests_running"] == 1 and s["cache_pages_used"] >= 1,
                     what="the second request admitted")
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    d.wait_stats(lambda s: not s["requests"] and s["cache_pages_used"] == 0,
                 what="the second request ending")


def test_snapshot_survives_a_restart(fresh_daemon):
    a = fresh_daemon()
    system = prompt(7, 300)
    r = a.x4ctl("snapshot", "create", "sys", "--tokens", ",".join(map(str, system)))
    assert r.returncode == 0, r.stderr
    assert a.terminate() == 0
    b = fresh_daemon()  # a new process with its own state directory: move the file over
    (b.state / "sys.x4snap").write_bytes((a.state / "sys.x4snap").read_bytes())
    r = b.x4ctl("snapshot", "list", "--json")
    assert '"sys"' in r.stdout
    resumed, done = gen(b, [13, 14, 15], "--snapshot", "sys", "--max-tokens", "8")
    assert (done["usage"]["prompt_tokens"], done["usage"]["cached_tokens"]) == (303, 300)
    full, done = gen(b, system + [13, 14, 15], "--max-tokens", "8")
    assert resumed == full and len(full) == 8
    # resumed again: its first full page is now shared from the prefix store, not re-read
    hits = b.stats()["prefix_hits"]
    again, done = gen(b, [13, 14, 15], "--snapshot", "sys", "--max-tokens", "8")
    assert again == full and done["usage"]["cached_tokens"] == 300
    assert b.stats()["prefix_hits"] == hits + 1
