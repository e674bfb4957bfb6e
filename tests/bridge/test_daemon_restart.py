# SPDX-License-Identifier: MIT
"""The daemon dies under a running request and comes back: the client gets a proper error (an SSE
error event once streaming), /health says 503, and the bridge reconnects by itself afterwards."""
import json
import os
import time

from conftest import Daemon, chat


def test_daemon_crash_then_restart(demo_model, make_bridge, tmp_path):
    d = Daemon(tmp_path, demo_model)
    try:
        b = make_bridge([d.sock])
        c = b.conn()
        c.request("POST", "/v1/chat/completions", body=json.dumps(chat("go", max_tokens=4000, stream=True, ignore_eos=True)),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200
        r.readline()  # the first event is there: the generation runs
        d.proc.kill()
        d.proc.wait(timeout=10)
        rest = r.read().decode()
        events = [x for x in rest.split("\n\n") if x.startswith("data: ")]
        err = json.loads(events[-1][6:])["error"]
        assert "xing4d is unreachable" in err["message"] and err["code"] == "daemon_unreachable"
        c.close()
        st, hdrs, body = b.request("GET", "/health")
        assert st == 503 and body["status"] == "unavailable" and hdrs["retry-after"] == "1"
        st, hdrs, body = b.post("/v1/chat/completions", chat(max_tokens=2))
        assert st == 503 and hdrs["retry-after"] == "2"
    finally:
        d.close()
    os.unlink(d.sock)
    os.unlink(tmp_path / "notify.sock")
    d2 = Daemon(tmp_path, demo_model)
    try:
        # the bridge retries a failed daemon at most once a second
        deadline = time.monotonic() + 10
        while True:
            st, _, body = b.post("/v1/chat/completions", chat(max_tokens=2))
            if st == 200 or time.monotonic() > deadline:
                break
        assert st == 200, body
        assert b.request("GET", "/health")[0] == 200
    finally:
        d2.close()


def test_sigterm_drains_running_requests(bridge, daemon, make_bridge):
    import signal
    b = make_bridge([daemon.sock])
    c = b.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(chat("go", max_tokens=4000, stream=True, ignore_eos=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first = json.loads(r.readline().decode()[6:])
    b.proc.send_signal(signal.SIGTERM)
    # still serving the running stream, refusing new work
    deadline = time.monotonic() + 10
    while True:
        st, hdrs, body = b.post("/v1/chat/completions", chat(max_tokens=2))
        if st == 503 or time.monotonic() > deadline:
            break
    assert st == 503 and body["error"]["code"] == "shutting_down" and hdrs["retry-after"] == "1"
    st, _, body = b.request("GET", "/ready")
    assert st == 503 and body["status"] == "draining"
    assert b.proc.poll() is None
    # the running request ends (cancelled here, to keep the test short): the bridge exits cleanly
    assert b.request("DELETE", f"/v1/requests/{first['id']}")[0] == 200
    assert '"code":"request_cancelled"' in r.read().decode()
    c.close()
    assert b.proc.wait(timeout=10) == 0
