# SPDX-License-Identifier: MIT
"""Findings of the security review: what one local client can do to everybody else (idle sockets,
connection floods, fd exhaustion, huge prompts), each answered with a message naming the limit."""
import os
import struct
import resource
import subprocess
import time

import x4wire as w


def say_hello(c):
    """Send Hello and return the answer: a refused connection may already be closed when the
    Hello goes out (EPIPE), its Error is still there to read."""
    try:
        c.send(w.frame(0, w.HELLO, w.hello()))
    except BrokenPipeError:
        pass
    return c.recv()


def test_a_connection_without_hello_is_closed_at_the_deadline(fresh_daemon):
    d = fresh_daemon(args=("--hello-timeout", "1"))
    c = w.Conn(d.sock, timeout=20)
    t0 = time.monotonic()
    # nothing sent: the daemon answers with an Error naming the limit, then EOF
    assert w.error_of(c.recv()) == (
        "PROTOCOL", "no Hello within the hello-timeout of 1.0 s: closing the connection")
    assert c.closed_by_server()
    waited = time.monotonic() - t0
    assert 0.9 <= waited < 10, f"closed after {waited:.2f} s, the limit is 1 s"
    # a client that says Hello in time keeps its connection past the deadline
    ok = w.Conn(d.sock, timeout=20)
    ok.hello()
    idle = w.Conn(d.sock, timeout=20)
    assert w.error_of(idle.recv())[0] == "PROTOCOL"  # the deadline has passed for `ok` too
    ok.send(w.frame(3, w.HEALTH))
    assert w.HEALTH_REPLY in ok.recv()


def test_at_the_connection_limit_the_longest_idle_connection_makes_room(fresh_daemon):
    import re
    d = fresh_daemon(args=("--max-connections", "2"))
    a = w.Conn(d.sock, timeout=20)
    a.hello()
    b = w.Conn(d.sock, timeout=20)
    b.hello()
    # a third client is served: the connection idle the longest (a) is closed, told why
    c = w.Conn(d.sock, timeout=20)
    c.hello()
    code, msg = w.error_of(a.recv())
    assert code == "RESOURCE_EXHAUSTED" and re.fullmatch(
        r"connection limit of 2 reached: closing this connection, idle the longest "
        r"\(\d+\.\d s\), to serve a new one", msg), msg
    assert a.closed_by_server()
    # connections with a request in flight are never closed for this: a new one is refused
    for k, conn in enumerate((b, c)):
        conn.send(w.frame(k + 1, w.GENERATE, w.generate_tokens([5, 6, 7], max_tokens=100000,
                                                                ignore_eos=True)))
        assert w.CHUNK in conn.recv()
    e = w.Conn(d.sock, timeout=20)
    assert w.error_of(say_hello(e)) == ("RESOURCE_EXHAUSTED", "2 connections open, limit 2")
    assert e.closed_by_server()
    b.close()
    c.close()
    # the slots come back once the daemon has seen the closes: a new client is served
    assert serves_a_new_client(d)


def test_idle_connections_are_closed_after_the_idle_timeout(fresh_daemon):
    d = fresh_daemon(args=("--idle-timeout", "1"))
    c = w.Conn(d.sock, timeout=20)
    c.hello()
    busy = w.Conn(d.sock, timeout=20)
    busy.hello()
    busy.send(w.frame(1, w.GENERATE, w.generate_tokens([5, 6, 7], max_tokens=100000,
                                                       ignore_eos=True)))
    t0 = time.monotonic()
    assert w.error_of(c.recv()) == (
        "UNAVAILABLE", "idle for 1 s (idle-timeout 1 s): closing the connection")
    assert c.closed_by_server()
    waited = time.monotonic() - t0
    assert 0.9 <= waited < 5, f"closed after {waited:.2f} s, the limit is 1 s"
    # the connection with a request in flight stays, streaming
    for _ in range(3):
        assert w.CHUNK in busy.recv()
    busy.close()


def serves_a_new_client(d, timeout=30):
    """Retry (each try waits on the daemon's answer) until a Hello is answered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = w.Conn(d.sock, timeout=10)
            c.send(w.frame(0, w.HELLO, w.hello()))
            f = c.recv()
        except OSError:
            continue
        ok = f is not None and w.HELLO_REPLY in f
        if ok:
            c.send(w.frame(5, w.HEALTH))
            ok = w.HEALTH_REPLY in c.recv()
        c.close()
        if ok:
            return True
    return False


def test_a_connection_flood_under_a_low_fd_limit_neither_spins_nor_floods_the_log(fresh_daemon):
    limit = 100

    def low_fd_limit():  # soft = hard: the daemon cannot raise it
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    d = fresh_daemon(preexec_fn=low_fd_limit)
    n_before = len(d.log)
    conns = []
    for _ in range(2 * limit):  # more connections than the daemon has descriptors
        c = w.Conn(d.sock, timeout=20)
        conns.append(c)
        # every new client is served: the longest idle connection makes room
        assert w.HELLO_REPLY in say_hello(c)
    # the oldest ones were closed, each told why
    closed = 0
    for c in conns[:2 * limit - 50]:
        f = c.recv()
        assert f is not None and "idle the longest" in w.error_of(f)[1], f
        closed += 1
    assert closed == 150
    for c in conns:
        c.close()
    assert serves_a_new_client(d)
    # the log is read by a thread: wait (with a deadline) for the start-up line to be there
    deadline = time.monotonic() + 20
    while not any("--max-connections 1024: lowered to 50, the open file limit is 100" in x
                  for x in d.log):
        assert time.monotonic() < deadline, d.log[-5:]
        d.proc.poll()
    # one info line per accepted Hello is expected; the 150 closes must not each log one
    flood = [x for x in d.log[n_before:]
             if "lowered to" not in x and "client 'pytest', protocol" not in x]
    assert len(flood) < 10, f"{len(flood)} log lines for {closed} closes: {flood[:5]}"
    assert any("connection limit of 50 reached: closing this connection" in x for x in flood)


def test_a_thousand_idle_connections_do_not_lock_a_new_client_out(fresh_daemon):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    d = fresh_daemon()
    conns = []
    try:
        for _ in range(1100):  # past the default --max-connections of 1024
            for _ in range(1000):
                try:
                    c = w.Conn(d.sock, timeout=20)
                    break
                except BlockingIOError:  # the listen backlog is full: the daemon catches up
                    time.sleep(0.002)
            c.send(w.frame(0, w.HELLO, w.hello()))
            conns.append(c)
        # the last ones are answered (the oldest idle were closed for them)
        assert w.HELLO_REPLY in conns[-1].recv()
        assert serves_a_new_client(d, timeout=20)
        r = d.x4ctl("generate", "--tokens", "5,6,7", "--max-tokens", "4")
        assert r.returncode == 0, r.stderr
    finally:
        for c in conns:
            c.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


SMALL_CONTEXT = "[xing4d]\ncache-pages = 2\npage_tokens = 16\nmax-running = 2\n"  # 32 tokens


def generate_text(text):
    return w.field_bytes(1, text) + w.field_varint(5, 1)


def generate_chat(messages):
    chat = b"".join(w.field_bytes(1, w.field_bytes(1, role) + w.field_bytes(2, content))
                    for role, content in messages)
    return w.field_bytes(3, chat) + w.field_varint(5, 1)


def test_a_text_prompt_that_cannot_fit_is_refused_before_tokenizing(fresh_daemon):
    import re
    d = fresh_daemon(conf=SMALL_CONTEXT)
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.frame(1, w.GENERATE, generate_text("a" * 1_000_000)))
    code, msg = w.error_of(c.recv())
    m = re.fullmatch(r"prompt\.text: 1000000 bytes cannot fit the context limit of 32 tokens "
                     r"\(at most (\d+) bytes\)", msg)
    assert code == "TOO_LARGE" and m, msg
    limit = int(m.group(1))
    assert limit % 32 == 0 and 32 <= limit <= 32 * 64, limit
    # at the limit the text is tokenized: refused then for its token count, not its size
    c.send(w.frame(2, w.GENERATE, generate_text("a" * limit)))
    code, msg = w.error_of(c.recv())
    assert code == "TOO_LARGE" and "leaves no room for output" in msg, msg
    # the same cap covers a chat's contents
    c.send(w.frame(3, w.GENERATE, generate_chat([("user", "b" * (limit + 1))])))
    assert w.error_of(c.recv()) == (
        "TOO_LARGE", f"prompt.chat: {limit + 1} bytes cannot fit the context limit of 32 tokens "
                     f"(at most {limit} bytes)")
    # x4ctl says what its user gave, the prompt (the field is the protocol's name for it)
    for args in ((), ("--raw",)):
        r = d.x4ctl("generate", *args, input="b" * (limit + 1))
        assert r.returncode == 1, r.stderr
        assert r.stderr == (f"x4ctl: the prompt: {limit + 1} bytes cannot fit the context limit of 32 "
                            f"tokens (at most {limit} bytes)\n"), r.stderr
    # x4ctl chat: the conversation so far, this line included
    r = d.x4ctl("chat", input="b" * (limit + 1) + "\n")
    assert r.returncode == 1, r.stderr
    assert f"x4ctl: the conversation: {limit + 1} bytes cannot fit the context limit" in r.stderr, r.stderr


def test_the_number_of_chat_messages_is_capped(fresh_daemon):
    d = fresh_daemon(args=("--max-messages", "3"))
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.frame(1, w.GENERATE, generate_chat([("user", "hi")] * 4)))
    assert w.error_of(c.recv()) == ("INVALID_ARGUMENT",
                                    "prompt.chat.messages: 4 messages, at most 3 accepted")
    c.send(w.frame(2, w.GENERATE, generate_chat([("user", "hi")] * 3)))
    f = c.recv()
    while w.DONE not in f:
        assert w.ERROR not in f, w.error_of(f)
        f = c.recv()


def test_mkmodel_names_the_write_error(tmp_path):
    # /dev/full fails every write with ENOSPC: the message must say so, not a generic failure
    from conftest import BUILD
    tool = BUILD / "tools" / "x4-mkmodel"
    r = subprocess.run([str(tool), "--preset", "tiny", "--quiet", "--out", str(tmp_path / "m.gguf"),
                        "--config-out", "/dev/full"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "/dev/full: write failed: No space left on device" in r.stderr, r.stderr


def test_snapshot_symlinks_are_not_followed(fresh_daemon, tmp_path):
    d = fresh_daemon()
    secret = tmp_path / "secret"
    secret.write_text("not a snapshot, and not the daemon's to touch\n")
    planted = d.state / "evil.x4snap"
    planted.symlink_to(secret)
    # reading through it: refused, named
    r = d.x4ctl("generate", "--tokens", "13", "--snapshot", "evil")
    assert r.returncode != 0
    assert f"snapshot {planted}: a symbolic link, not followed" in r.stderr, r.stderr
    r = d.x4ctl("snapshot", "drop", "evil")
    assert r.returncode != 0 and "a symbolic link, not followed" in r.stderr, r.stderr
    assert planted.is_symlink()
    # a link planted at the temporary name is not written through either
    (d.state / "other.x4snap.tmp").symlink_to(secret)
    r = d.x4ctl("snapshot", "create", "other", "--tokens", "5,6,7,8")
    assert r.returncode == 0, r.stderr
    # creating over the link (asked to replace) replaces the link, not its target
    r = d.x4ctl("snapshot", "create", "evil", "--tokens", "5,6,7,8")
    assert r.returncode == 8 and "snapshot 'evil': already exists" in r.stderr, r.stderr
    assert planted.is_symlink()
    r = d.x4ctl("snapshot", "create", "--replace", "evil", "--tokens", "5,6,7,8")
    assert r.returncode == 0, r.stderr
    assert secret.read_text() == "not a snapshot, and not the daemon's to touch\n"
    assert not planted.is_symlink() and planted.stat().st_size > 0
    assert not (d.state / "other.x4snap").is_symlink()
    assert not (d.state / "other.x4snap.tmp").exists()


def test_a_file_that_is_not_a_snapshot_can_be_dropped(fresh_daemon):
    """A truncated or overwritten NAME.x4snap is refused when read, named as not a snapshot, and
    drop removes it (else the name could never be used again but with --replace)."""
    d = fresh_daemon()
    (d.state / "bad.x4snap").write_text("garbage\n")
    r = d.x4ctl("generate", "--tokens", "13", "--snapshot", "bad")
    assert r.returncode != 0 and "not a version 1 or 2 xing4d snapshot file" in r.stderr, r.stderr
    r = d.x4ctl("snapshot", "drop", "bad")
    assert r.returncode == 0, r.stderr
    assert not (d.state / "bad.x4snap").exists()
    r = d.x4ctl("snapshot", "create", "bad", "--tokens", "5,6,7,8")
    assert r.returncode == 0, r.stderr


def test_snapshot_quota(fresh_daemon):
    d = fresh_daemon(args=("--max-snapshots", "2"))
    for name in ("a", "b"):
        r = d.x4ctl("snapshot", "create", name, "--tokens", "5,6,7,8")
        assert r.returncode == 0, r.stderr
    r = d.x4ctl("snapshot", "create", "c", "--tokens", "5,6,7,8")
    assert r.returncode != 0
    assert ("snapshot 'c': 2 snapshots exist, limit 2 (max-snapshots): drop one first"
            in r.stderr), r.stderr
    assert not (d.state / "c.x4snap").exists()
    # replacing one is not one more
    r = d.x4ctl("snapshot", "create", "--replace", "a", "--tokens", "5,6,7,8,9")
    assert r.returncode == 0, r.stderr
    size = (d.state / "a.x4snap").stat().st_size
    e = fresh_daemon(args=("--max-snapshot-bytes", str(size + size // 2)))
    r = e.x4ctl("snapshot", "create", "x", "--tokens", "5,6,7,8,9")
    assert r.returncode == 0, r.stderr
    r = e.x4ctl("snapshot", "create", "y", "--tokens", "5,6,7,8,9")
    assert r.returncode != 0
    assert (f"snapshot 'y': {size} bytes more would bring the snapshots to {2 * size} bytes, "
            f"limit {size + size // 2} (max-snapshot-bytes)") in r.stderr, r.stderr


def test_client_text_is_escaped_in_the_log_and_errors(fresh_daemon):
    d = fresh_daemon()
    c = w.Conn(d.sock)
    c.send(w.frame(0, w.HELLO, w.hello(client=b"evil\nxing4d: forged line \x1b[31m\xff")))
    assert w.HELLO_REPLY in c.recv()
    # a snapshot name with a newline and a byte that is not UTF-8, echoed in the Error
    name = b"a\nb\xff"
    req = w.field_varint(1, 1) + w.field_bytes(2, name) + w.field_bytes(3, "5,6")
    c.send(w.frame(4, w.SNAPSHOT, req))
    f = c.recv()
    e = w.parse(f[w.ERROR][0])
    raw = e[2][0]
    raw.decode("utf-8")  # valid UTF-8: any client's protobuf decoder accepts it
    assert b"\n" not in raw and b"\xff" not in raw
    assert "snapshot name 'a\\nb\\xff'" in raw.decode(), raw
    c.send(w.frame(5, w.HEALTH))
    assert w.HEALTH_REPLY in c.recv()
    deadline = time.monotonic() + 20
    while not any("client 'evil\\nxing4d: forged line \\x1b[31m\\xff'" in x for x in d.log):
        assert time.monotonic() < deadline, d.log[-5:]
        d.proc.poll()
    assert not any(x.startswith("xing4d: forged") for x in d.log)


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_out_of_descriptors_pauses_accepting_instead_of_spinning(fresh_daemon):
    # 14 descriptors: the daemon's own ~9 plus a clamped --max-connections of 7 do not fit, so
    # accept() itself fails with EMFILE while clients wait in the listen backlog
    def tiny_fd_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (14, 14))
    d = fresh_daemon(preexec_fn=tiny_fd_limit)
    n_before = len(d.log)
    conns = []
    for _ in range(12):
        c = w.Conn(d.sock, timeout=20)
        try:
            c.send(w.frame(0, w.HELLO, w.hello()))
        except BrokenPipeError:
            pass  # already answered (RESOURCE_EXHAUSTED, read below) and closed by the daemon
        conns.append(c)
    deadline = time.monotonic() + 20
    while not any("accept() failed: Too many open files" in x for x in d.log[n_before:]):
        assert time.monotonic() < deadline, d.log[n_before:][-5:]
        d.proc.poll()
    # measured over a window: a listener that retried accept() at once would use it all
    cpu0, t0 = cpu_seconds(d.proc.pid), time.monotonic()
    while time.monotonic() - t0 < 2:
        d.proc.poll()
    used = cpu_seconds(d.proc.pid) - cpu0
    assert used < 0.5, f"the daemon used {used:.2f} s of CPU in 2 s while out of descriptors"
    # the clients it could not take were told so (not left waiting in the backlog)
    told = []
    for c in conns:
        c.s.settimeout(2)
        try:
            f = c.recv()
        except OSError:
            continue
        if f is not None and w.ERROR in f:
            told.append(w.error_of(f))
    assert told, "no waiting client was answered at the open file limit"
    code, msg = told[0]
    assert code == "RESOURCE_EXHAUSTED" and "open file limit" in msg and "retry later" in msg, told[0]
    for c in conns:
        c.close()
    assert serves_a_new_client(d)
    lines = [x for x in d.log[n_before:] if "client 'pytest', protocol" not in x]
    assert len(lines) < 10, lines[:10]


def rss_bytes(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_unfinished_frames_are_bounded_across_connections(fresh_daemon):
    # under ASan, freed memory (a refused connection's input) waits in a 256 MiB quarantine:
    # keep it small so RSS measures the daemon, not the sanitizer
    asan = os.environ.get("ASAN_OPTIONS", "")
    d = fresh_daemon(env=(f"ASAN_OPTIONS={asan}{':' if asan else ''}quarantine_size_mb=8",))
    base = rss_bytes(d.proc.pid)
    size = 16 << 20  # the default --max-frame
    conns, refused = [], []
    for _ in range(40):
        c = w.Conn(d.sock, timeout=20)
        c.hello()
        try:
            # a header announcing a whole frame, then all of it but the last kilobyte
            c.send_raw(struct.pack(">I", size) + bytes(size - 1024))
        except (BrokenPipeError, ConnectionResetError):
            pass
        conns.append(c)
    grown = rss_bytes(d.proc.pid) - base
    assert grown < 400e6, f"40 unfinished 16 MiB frames grew the daemon by {grown / 1e6:.0f} MB"
    for c in conns:
        c.s.settimeout(0.2)
        try:
            f = c.recv()
        except (TimeoutError, OSError):
            continue  # admitted: still waiting for the rest of its frame
        if f is not None:
            refused.append(w.error_of(f))
    # the default limit of 256 MiB holds 16 of them; the others are told why
    assert len(refused) == 24, refused
    assert refused[0] == ("RESOURCE_EXHAUSTED",
                          f"frame of {size} bytes refused: the daemon holds {256 << 20} bytes of "
                          f"unfinished frames from all connections, limit {256 << 20} "
                          f"(max-pending-bytes); retry later")
    assert serves_a_new_client(d)
    for c in conns:
        c.close()
    # the held memory comes back: a new big frame is admitted again (it is not a valid Frame,
    # so the answer is a PROTOCOL error, not RESOURCE_EXHAUSTED)
    deadline = time.monotonic() + 20
    while True:
        c = w.Conn(d.sock, timeout=20)
        c.hello()
        c.send_raw(struct.pack(">I", size) + bytes(size))
        code, msg = w.error_of(c.recv())
        c.close()
        if code == "PROTOCOL":
            break
        assert time.monotonic() < deadline, msg
