# SPDX-License-Identifier: MIT
"""xing4-http at its limits: the descriptor limit, a client that reads slowly."""
import resource
import socket
import time

from conftest import chat  # noqa: F401


def cpu_seconds(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / __import__("os").sysconf("SC_CLK_TCK")


def test_descriptor_limit_does_not_spin(fake, make_bridge):
    """At its descriptor limit the bridge stops accepting for a while (one warning, no busy loop),
    answers the clients still waiting in its backlog a 503 with Retry-After instead of leaving them
    hanging, and serves again once connections close."""
    b = make_bridge([fake["socket"]], "--timeout", "3",
                    preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    held = []
    for _ in range(90):
        s = socket.socket()
        s.connect(("127.0.0.1", b.port))  # the backlog takes them even when accept() fails
        held.append(s)
    time.sleep(0.5)
    before = cpu_seconds(b.proc.pid)
    time.sleep(2)
    used = cpu_seconds(b.proc.pid) - before
    assert used < 0.5, f"{used:.2f} s of CPU in 2 s at the descriptor limit"
    warnings = [x for x in b.log if "accept" in x]
    assert 1 <= len(warnings) <= 2, warnings[:5]
    assert "Too many open files" in warnings[0] and "not accepting" in warnings[0], warnings[0]
    # those past the limit were answered and closed: a 503 that says why and when to retry
    shed = []
    for s in held:
        s.settimeout(0.05)
        try:
            got = s.recv(4096)
        except OSError:
            continue
        if got:
            shed.append(got)
    assert shed, "no waiting client was answered at the descriptor limit"
    head, _, body = shed[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in head, shed[0]
    err = __import__("json").loads(body)["error"]
    assert err["code"] == "too_many_connections" and "retry later" in err["message"], err
    for s in held:
        s.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            status, _, body = b.request("GET", "/health", timeout=2)
            break
        except OSError:
            assert time.monotonic() < deadline, "the bridge never served again"
    assert status == 200, body


def records(fake):
    import json
    if not fake["record"].exists():
        return []
    return [json.loads(x) for x in fake["record"].read_text().splitlines()]


def test_a_slow_reader_pauses_its_generation(fake, make_bridge):
    """A streaming client that does not read: the bridge pauses its generation in the daemon (a
    Pause frame) instead of buffering the rest of the answer, and resumes it as the client reads;
    the client gets the whole answer."""
    import json
    b = make_bridge([fake["socket"]])
    n = 4000  # ~4 MB of text, more as SSE
    before = len(records(fake))
    rss0 = b.rss_kib()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
    s.connect(("127.0.0.1", b.port))
    body = json.dumps(chat(f"flood-{n}", stream=True, max_tokens=n + 10)).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    deadline = time.monotonic() + 10
    while {"pause": True} not in records(fake)[before:]:
        assert time.monotonic() < deadline, "the bridge never paused the generation"
        time.sleep(0.05)
    time.sleep(0.5)
    grown = b.rss_kib() - rss0
    assert grown < 4096, f"the bridge grew by {grown} KiB for a client that does not read"
    data = b""
    s.settimeout(30)
    while True:
        d = s.recv(1 << 16)
        if not d:
            break
        data += d
    s.close()
    text = data.decode()
    assert "data: [DONE]" in text[-200:] and text.endswith("\r\n0\r\n\r\n"), text[-300:]
    for i in (0, n // 2, n - 1):
        assert '"content":"%04d' % i in text, i
    seen = records(fake)[before:]
    assert {"pause": False} in seen, seen


def test_a_slow_reader_is_paused_in_the_real_daemon(bridge, daemon):
    """x4ctl stats shows the request paused while its streaming client does not read, and the
    other requests on the bridge's daemon connection go on meanwhile."""
    import json
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    s.connect(("127.0.0.1", bridge.port))
    # 20 alternatives make each token's event a few KB: the socket buffers fill in seconds
    body = json.dumps(chat("go on", stream=True, max_tokens=200000, ignore_eos=True, logprobs=True,
                           top_logprobs=20, chat_template_kwargs={"enable_thinking": False})).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    try:
        deadline = time.monotonic() + 120
        while True:
            reqs = daemon.stats()["requests"]
            if reqs and reqs[0].get("paused"):
                break
            assert time.monotonic() < deadline, f"never paused: {reqs}"
            time.sleep(0.2)
        st, _, out = bridge.post("/v1/chat/completions", chat("hi", max_tokens=4))
        assert st == 200, out
    finally:
        s.close()
