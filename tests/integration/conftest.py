# SPDX-License-Identifier: MIT
"""The real daemon, started the way systemd starts it: systemd-socket-activate holds the socket,
execs xing4d on the first connection with LISTEN_FDS, and we read READY=1 / STATUS= / STOPPING=1
from our own NOTIFY_SOCKET, exactly what a Type=notify unit would see.

Binaries come from X4_XING4D / X4_X4CTL / X4_CLIENT_TEST (set by tests/integration/meson.build),
else from X4_BUILD_DIR (default <source>/build). The daemons run on --device cpu, or on
X4_TEST_DEVICE (tests/gpu/run.sh runs test_mtp.py with X4_TEST_DEVICE=cuda; X4_CUDA_MODULE, when
set, is passed on to them)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

SRC = Path(os.environ.get("X4_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("X4_BUILD_DIR", SRC / "build"))
XING4D = Path(os.environ.get("X4_XING4D", BUILD / "daemon" / "xing4d"))
X4CTL = Path(os.environ.get("X4_X4CTL", BUILD / "cli" / "x4ctl"))
FIXTURES = Path(os.environ.get("X4_FIXTURES", SRC / "tests" / "fixtures"))
MODEL = FIXTURES / "xing4-tiny-a" / "model.gguf"
DEVICE = os.environ.get("X4_TEST_DEVICE", "cpu")
N_VOCAB = 512  # the fixture's vocabulary (tests/fixtures/xing4-tiny-a/README.md)
# X4_TEST_SANITIZED=1: the binaries are the ASan+UBSan build (scripts/run-tests.sh sets it for that
# pass only), where the CPU-bound tests run about 19 times slower. The few slowest tests then run
# at a smaller size (sized(); each says why and what it keeps): the sanitizer pass is there to
# find memory errors on the same code paths, which a smaller size still takes, while the plain
# build's pass keeps every test at its full size.
SANITIZED = os.environ.get("X4_TEST_SANITIZED") == "1"


def sized(full, sanitized):
    """full in the plain run, sanitized under X4_TEST_SANITIZED=1."""
    return sanitized if SANITIZED else full

# A context of 64 pages x 256 tokens: a request asking for "as many tokens as fit" runs for
# seconds on the tiny model, long enough to observe and cancel it.
DEFAULT_CONF = "[xing4d]\n# test settings\ncache-pages = 64\npage_tokens = 256\nmax-running = 4\n"


class Daemon:
    def __init__(self, tmp: Path, conf: str = DEFAULT_CONF, args=(), env=(), preexec_fn=None):
        for p in (XING4D, X4CTL, MODEL):
            if not p.exists():
                pytest.fail(f"{p} does not exist: build first (meson compile) or set X4_BUILD_DIR")
        self.dir = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.sock = str(tmp / "xing4d.sock")
        self.conf = tmp / "xing4d.conf"
        self.state = tmp / "state"
        self.state.mkdir()
        self.conf.write_text(conf + f"state-dir = {self.state}\n")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify_path = str(tmp / "notify.sock")
        self.notify.bind(self.notify_path)
        self.messages = []
        self.log = []
        if DEVICE != "cpu" and os.environ.get("X4_CUDA_MODULE"):
            env = (*env, f"X4_CUDA_MODULE={os.environ['X4_CUDA_MODULE']}")
        # systemd-socket-activate starts xing4d with only the -E variables: a loader path the
        # tests run under (libraries unpacked beside the system's, as on the GPU machine) goes too
        if os.environ.get("LD_LIBRARY_PATH"):
            env = (*env, f"LD_LIBRARY_PATH={os.environ['LD_LIBRARY_PATH']}")
        cmd = ["systemd-socket-activate", "-l", self.sock,
               "-E", f"NOTIFY_SOCKET={self.notify_path}",
               *[x for e in env for x in ("-E", e)],
               "--", str(XING4D), "--config", str(self.conf), "--model", str(MODEL),
               "--threads", "1", "--device", DEVICE, *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
        # systemd-socket-activate says "Listening on PATH as 3." once the socket exists
        line = self.proc.stderr.readline()
        assert "Listening on" in line, f"systemd-socket-activate: {line!r}"
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        # the first connection starts the daemon; it stays in the backlog until accepted
        self.trigger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.trigger.connect(self.sock)
        self.wait_notify("READY=1", timeout=60)
        self.trigger.close()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))

    def wait_notify(self, what, timeout):
        """Block until a notify datagram containing the line `what` arrives (or fail)."""
        deadline = time.monotonic() + timeout
        while True:
            if any(what in m.split("\n") for m in self.messages):
                return
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                pytest.fail(f"no {what} from xing4d (rc {self.proc.poll()}); notify: "
                            f"{self.messages}; log: {self.log[-20:]}")
            self.notify.settimeout(left)
            try:
                self.messages.append(self.notify.recv(4096).decode())
            except socket.timeout:
                pass

    def x4ctl(self, *args, timeout=60, **kw):
        return subprocess.run([str(X4CTL), "--socket", self.sock, *args], capture_output=True,
                              text=True, timeout=timeout, **kw)

    def x4ctl_popen(self, *args):
        return subprocess.Popen([str(X4CTL), "--socket", self.sock, *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stats(self):
        r = self.x4ctl("stats", "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def wait_stats(self, pred, timeout=30, what="condition"):
        """Poll the daemon's stats until pred(stats) holds: waiting on observable state, with a
        deadline, instead of sleeping a guessed time."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if pred(s):
                return s
            if time.monotonic() > deadline:
                pytest.fail(f"stats never showed {what}: {s}")

    def terminate(self, timeout=30):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        # collect what was sent before the exit (STOPPING=1)
        self.notify.settimeout(0.01)
        try:
            while True:
                self.messages.append(self.notify.recv(4096).decode())
        except (socket.timeout, BlockingIOError):
            pass
        return rc

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.notify.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("xing4d"))
    yield d
    d.close()


@pytest.fixture
def fresh_daemon(tmp_path):
    made = []

    def make(conf=DEFAULT_CONF, args=(), env=(), preexec_fn=None):
        d = Daemon(tmp_path / f"d{len(made)}", conf, args, env, preexec_fn)
        made.append(d)
        return d
    yield make
    for d in made:
        d.close()


@pytest.fixture(scope="session")
def client_test(tmp_path_factory):
    """The C test client: built by meson (X4_CLIENT_TEST), else compiled here against the
    build tree's libx4client through its uninstalled pkg-config file, like a user would."""
    exe = os.environ.get("X4_CLIENT_TEST")
    if exe:
        return exe
    out = tmp_path_factory.mktemp("client") / "client-test"
    env = dict(os.environ, PKG_CONFIG_PATH=str(BUILD / "meson-uninstalled"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libx4client-uninstalled"],
                           capture_output=True, text=True, env=env, check=True).stdout.split()
    cc = shutil.which("cc") or "gcc"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-o", str(out),
                    str(Path(__file__).parent / "client-test.c"), *flags,
                    f"-Wl,-rpath,{BUILD / 'libclient'}"], check=True)
    return str(out)
