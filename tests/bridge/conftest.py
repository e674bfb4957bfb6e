# SPDX-License-Identifier: MIT
"""xing4-http over a real xing4d (demo model from x4-mkmodel, CPU backend, started under
systemd-socket-activate as in tests/integration) or over tests/bridge/fakedaemon.py.

Binaries come from X4_BUILD_DIR (default <source>/build); X4_XING4D, X4_X4CTL, X4_HTTP, X4_MKMODEL
override single ones. The bridge listens on 127.0.0.1 port 0 and we read the port it got from
its "listening on http://127.0.0.1:PORT" line, so parallel runs never collide."""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

SRC = Path(os.environ.get("X4_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("X4_BUILD_DIR", SRC / "build")).resolve()
XING4D = Path(os.environ.get("X4_XING4D", BUILD / "daemon" / "xing4d"))
X4CTL = Path(os.environ.get("X4_X4CTL", BUILD / "cli" / "x4ctl"))
HTTP = Path(os.environ.get("X4_HTTP", BUILD / "http-bridge" / "xing4-http"))
MKMODEL = Path(os.environ.get("X4_MKMODEL", BUILD / "tools" / "x4-mkmodel"))

sys.path.insert(0, str(Path(__file__).parent))
import fakedaemon  # noqa: E402

DAEMON_CONF = "[xing4d]\ncache-pages = 64\npage_tokens = 256\nmax-running = 4\n"


def need(p):
    if not p.exists():
        pytest.fail(f"{p} does not exist: build first (ninja -C BUILD) or set X4_BUILD_DIR")


class Daemon:
    """xing4d under systemd-socket-activate; READY=1 read from our own notify socket."""

    def __init__(self, tmp: Path, model: Path, conf=DAEMON_CONF):
        need(XING4D)
        self.sock = str(tmp / "xing4d.sock")
        (tmp / "xing4d.conf").write_text(conf)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(tmp / "notify.sock"))
        self.log = []
        self.proc = subprocess.Popen(
            ["systemd-socket-activate", "-l", self.sock, "-E", f"NOTIFY_SOCKET={tmp / 'notify.sock'}",
             "--", str(XING4D), "--config", str(tmp / "xing4d.conf"), "--model", str(model),
             "--threads", "1", "--device", "cpu", "--state-dir", str(tmp)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        assert "Listening on" in line, f"systemd-socket-activate: {line!r}"
        threading.Thread(target=lambda: [self.log.append(x) for x in self.proc.stderr], daemon=True).start()
        trigger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        trigger.connect(self.sock)
        deadline = time.monotonic() + 60
        msgs = ""
        while "READY=1" not in msgs.split("\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                pytest.fail(f"xing4d never said READY=1 (rc {self.proc.poll()}): {self.log[-10:]}")
            self.notify.settimeout(left)
            try:
                msgs += "\n" + self.notify.recv(4096).decode()
            except socket.timeout:
                pass
        trigger.close()

    def stats(self):
        need(X4CTL)
        r = subprocess.run([str(X4CTL), "--socket", self.sock, "stats", "--json"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.notify.close()


class Bridge:
    def __init__(self, sockets, *args, preexec_fn=None):
        need(HTTP)
        cmd = [str(HTTP), "--config", "/dev/null", "--listen", "127.0.0.1:0", *args]
        for s in sockets:
            cmd += ["--socket", s]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
        self.log = []
        self.port = None
        deadline = time.monotonic() + 30
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
                break
            if time.monotonic() > deadline:
                break
        if not self.port:
            self.proc.kill()
            pytest.fail(f"xing4-http did not start: {''.join(self.log)}")
        self.reader = threading.Thread(target=lambda: [self.log.append(x) for x in self.proc.stderr], daemon=True)
        self.reader.start()
        self.base = f"http://127.0.0.1:{self.port}"

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, headers dict lower-cased, parsed JSON or raw bytes)."""
        c = self.conn(timeout)
        h = {"Content-Type": "application/json", **(headers or {})}
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        try:
            return r.status, hdrs, json.loads(data)
        except ValueError:
            return r.status, hdrs, data

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def exited_log(self, timeout=10):
        """The whole stderr of a bridge that has exited: the reader thread runs to the end of the
        pipe first (a line written just before the exit may not have been read when wait() returns)."""
        self.reader.join(timeout)
        return "".join(self.log)

    def rss_kib(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory):
    need(MKMODEL)
    d = tmp_path_factory.mktemp("model")
    out = d / "demo.gguf"
    subprocess.run([str(MKMODEL), "--preset", "demo", "--out", str(out), "--quiet", "--threads", "2"],
                   check=True, timeout=300)
    return out


@pytest.fixture(scope="session")
def daemon(tmp_path_factory, demo_model):
    d = Daemon(tmp_path_factory.mktemp("xing4d"), demo_model)
    yield d
    d.close()


@pytest.fixture(scope="session")
def bridge(daemon):
    b = Bridge([daemon.sock])
    yield b
    b.close()


@pytest.fixture
def make_bridge():
    made = []

    def make(sockets, *args, **kw):
        b = Bridge(sockets, *args, **kw)
        made.append(b)
        return b
    yield make
    for b in made:
        b.close()


@pytest.fixture(scope="session")
def fake(tmp_path_factory):
    d = tmp_path_factory.mktemp("fake")
    path = str(d / "fake.sock")
    record = d / "requests.jsonl"
    srv = fakedaemon.serve(path, str(record))
    yield {"socket": path, "record": record}
    srv.close()


@pytest.fixture(scope="session")
def fake_bridge(fake):
    b = Bridge([fake["socket"]])
    yield b
    b.close()


def chat(content="Hello", **kw):
    body = {"model": "xing4", "messages": [{"role": "user", "content": content}], "max_tokens": 8}
    body.update(kw)
    return body


def assert_openai_error(status, body, want_status, message_part, param=None):
    """The error has OpenAI's shape, the status, and a message a user can act on."""
    assert status == want_status, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert message_part in e["message"], e["message"]
    if param is not None:
        assert e["param"] == param, e
    return e
