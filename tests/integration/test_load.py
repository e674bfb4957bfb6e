# SPDX-License-Identifier: MIT
"""Serving under load: what one client's long request, long prompt or second daemon does to the
others. Each test failed before the change it comes with (pages reserved for max_tokens up front,
one prefill chunk per step whatever its cost, a socket taken over by a second daemon)."""
import json
import os
import socket
import subprocess
import time

import pytest

import x4wire as w
from conftest import DEFAULT_CONF, MODEL, N_VOCAB, XING4D


def prompt(seed, n):
    return [5 + (seed * 131 + i * 17 + (i * i) % 7) % (N_VOCAB - 5) for i in range(n)]


def read_until_done(c, rid=None):
    """Frames of one request until its Done: (token ids, Done fields)."""
    ids = []
    while True:
        f = c.recv()
        assert f is not None, "connection closed before Done"
        assert w.ERROR not in f, w.error_of(f)
        if rid is not None and f[1][0] != rid:
            continue
        if w.CHUNK in f:
            ids += w.packed_varints(w.parse(f[w.CHUNK][0]).get(2, [b""])[0])
        elif w.DONE in f:
            return ids, w.parse(f[w.DONE][0])


# ---- --listen --------------------------------------------------------------------------------------

def direct_daemon(tmp_path, sock, *args):
    conf = tmp_path / "direct.conf"
    conf.write_text(DEFAULT_CONF + f"state-dir = {tmp_path / 'state'}\n")
    return subprocess.Popen([str(XING4D), "--config", str(conf), "--model", str(MODEL),
                             "--threads", "1", "--device", "cpu", "--listen", sock, *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def test_listen_on_a_live_daemons_socket_is_refused(fresh_daemon, tmp_path):
    d = fresh_daemon()
    assert d.x4ctl("health").returncode == 0
    p = direct_daemon(tmp_path, d.sock)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0
    assert (f"--listen {d.sock}: another daemon is serving on this socket; stop it first or "
            f"choose another path") in err, err
    # the first one keeps its socket and serves
    assert os.path.exists(d.sock)
    r = d.x4ctl("generate", "--tokens", "5,6,7", "--max-tokens", "3")
    assert r.returncode == 0, r.stderr


def test_a_daemon_unlinks_only_the_socket_it_bound(tmp_path):
    sock = str(tmp_path / "s.sock")
    # a stale socket file (nobody listens) is taken over
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(sock)
    stale.close()
    p = direct_daemon(tmp_path, sock)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                c = w.Conn(sock, timeout=20)
                c.hello()
                c.close()
                break
            except (ConnectionRefusedError, FileNotFoundError, AssertionError):
                assert time.monotonic() < deadline and p.poll() is None, p.stderr.read()
                time.sleep(0.05)
        # someone replaces the path with their own socket while the daemon runs
        os.unlink(sock)
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.bind(sock)
        other.listen(1)
        p.terminate()
        assert p.wait(timeout=30) == 0
        assert os.path.exists(sock), "the daemon deleted a socket it did not create"
        other.close()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
