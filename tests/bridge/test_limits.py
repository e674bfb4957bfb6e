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
    and serves again once connections close."""
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
