# SPDX-License-Identifier: MIT
"""x4ctl given what a new user gets wrong, against the daemon on the tiny fixture model: numbers
out of range say the range (not "is not a number" for 1e40 or "not a count" for 99999999999),
text that is not UTF-8 and stdin that cannot be read are named before anything is sent, extra
arguments are named, and a socket whose peer is not xing4d is said as such (exit 3, a hint)."""
import os
import socket
import subprocess
import threading

import pytest

from conftest import X4CTL

BAD_UTF8 = "convert it first, e.g. with iconv -f latin1 -t utf-8"


def run(sock, *args, stdin=b"", **kw):
    """x4ctl with bytes in and out: arguments may hold bytes that are not UTF-8."""
    return subprocess.run([os.fsencode(str(X4CTL)), b"--socket", os.fsencode(sock),
                           *[a if isinstance(a, bytes) else a.encode() for a in args]],
                          input=stdin, capture_output=True, timeout=60, **kw)


@pytest.mark.parametrize("args,message", [
    (["generate", "--max-tokens", "99999999999", "hi"],
     "--max-tokens: '99999999999' is not a count from 1 to 4294967295"),
    (["generate", "--temperature", "1e40", "hi"], "--temperature: '1e40' is out of the range of a float"),
    (["generate", "--top-p", "nan", "hi"], "--top-p: 'nan' is not a finite number"),
    (["generate", "--top-k", "99999999999", "hi"], "--top-k: '99999999999' is not a count from 0 to 4294967295"),
    # the daemon's ranges, said by x4ctl (it was the daemon's "sampling.temperature: ...", exit 1)
    (["generate", "--temperature", "-1", "hi"], "--temperature: '-1' is not a temperature from 0 (greedy) to 100"),
    (["generate", "--temperature", "101", "hi"], "--temperature: '101' is not a temperature from 0 (greedy) to 100"),
    (["generate", "--top-p", "0", "hi"], "--top-p: '0' is not a probability above 0 and at most 1"),
    (["generate", "--top-p", "1.5", "hi"], "--top-p: '1.5' is not a probability above 0 and at most 1"),
    (["generate", "--min-p", "1", "hi"], "--min-p: '1' is not a probability from 0 to below 1"),
    (["generate", "--repetition-penalty", "0", "hi"],
     "--repetition-penalty: '0' is not a factor above 0 and at most 10 (1: off)"),
    (["generate", "--presence-penalty", "2.5", "hi"], "--presence-penalty: '2.5' is not a penalty from -2 to 2"),
    (["generate", "--frequency-penalty", "-3", "hi"], "--frequency-penalty: '-3' is not a penalty from -2 to 2"),
    (["chat", "--temperature", "-1"], "--temperature: '-1' is not a temperature from 0 (greedy) to 100"),
    # the daemon refused it (exit 1); -1, its "no limit", is taken
    (["generate", "--thinking-budget", "-5", "hi"],
     "--thinking-budget: '-5' is not a token count from 0 to 2147483647, or -1 for no limit"),
    # the daemon refused it (exit 1) naming stop_ids[0], not the option
    (["generate", "--stop-id", "-1", "hi"], "--stop-id: '-1' is not a token id from 0 to 2147483647"),
    (["generate", "--seed", "-1", "hi"], "--seed: '-1' is not an unsigned integer from 0 to 18446744073709551615"),
    (["generate", "--tokens", "5,6,-3"], "--tokens: item 3, '-3', is not a token id (0 to 2147483647"),
    (["generate", "--tokens", "5 99999999999"], "--tokens: item 2, '99999999999', is not a token id"),
    (["generate", "--tokens", ", ,"], "--tokens: ', ,' holds no token ids (1,2,3 expected)"),
    # an empty item is a typo more likely than a list meant that way (it was taken as "1,2")
    (["generate", "--tokens", "1,,2"], "--tokens: item 2 is empty (two commas in a row"),
    (["generate", "--tokens", "1, 2,"], "--tokens: item 3 is empty (two commas in a row"),
    (["generate", "--tokens", ",1"], "--tokens: item 1 is empty (two commas in a row"),
    # accepted, then an interval beyond time_t's reach
    (["stats", "--watch=1e30"], "--watch: '1e30' is not an interval from 0.1 to 86400 s"),
    (["stats", "--watch", "2"], "stats: unexpected argument '2' (the interval goes with an '=': --watch=2)"),
    # ignored
    (["info", "--json", "extra"], "info: unexpected argument 'extra' (only --json is taken)"),
    # named '--json', the one argument it takes
    (["health", "--json", "extra"], "health: unexpected argument 'extra' (only --json is taken)"),
    (["--connect-timeout", "99999999999", "health"],
     "--connect-timeout: '99999999999' is not milliseconds from 0 to 2147483647, or -1 for no limit"),
])
def test_wrong_values_say_what_is_expected(daemon, args, message):
    r = run(daemon.sock, *args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    err = r.stderr.decode()
    assert err.startswith(f"x4ctl: {message}") and err.endswith(" (see x4ctl --help)\n"), err
    assert err.count("\n") == 1, err


def test_a_tiny_float_is_a_number(daemon):
    # underflow to the nearest float was refused as "is not a number"
    r = run(daemon.sock, "generate", "--temperature", "1e-50", "--max-tokens", "1", "--raw", "hi")
    assert r.returncode == 0, r.stderr


def test_one_token_budget_is_said_in_the_singular(daemon):
    # the fixture's template opens the reasoning: one token is all reasoning (seeded: unseeded,
    # 0.6% of draws are a turn end, which is another message, test_daemon.py)
    r = run(daemon.sock, "generate", "--max-tokens", "1", "--seed", "1", "hi")
    assert r.returncode == 7
    assert b"the output budget (1 token) ran out while the model was still thinking" in r.stderr, r.stderr


@pytest.mark.parametrize("args,stdin,message", [
    ([b"generate", b"\xff\xfe bad"], b"", "the prompt is not UTF-8 text (0xff at byte 0;"),
    (["generate"], b"ab\xffcd", "the prompt on stdin is not UTF-8 text (0xff at byte 2;"),
    (["generate", "--raw"], b"ab\xe9", "the prompt on stdin is not UTF-8 text (0xe9 at byte 2;"),
    ([b"generate", b"--system", b"caf\xe9", b"hi"], b"", "--system is not UTF-8 text (0xe9 at byte 3;"),
    ([b"generate", b"--stop", b"a\xff", b"hi"], b"", "--stop is not UTF-8 text (0xff at byte 1;"),
    ([b"snapshot", b"create", b"s", b"\xc3"], b"", "the prompt is not UTF-8 text (0xc3 at byte 0;"),
])
def test_text_that_is_not_utf8_is_refused(daemon, args, stdin, message):
    before = daemon.stats()["requests_total"]
    r = run(daemon.sock, *args, stdin=stdin)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.decode() == f"x4ctl: {message} {BAD_UTF8}) (see x4ctl --help)\n"
    assert daemon.stats()["requests_total"] == before  # nothing was sent


def test_a_chat_line_that_is_not_text_ends_a_piped_chat(daemon):
    r = run(daemon.sock, "chat", "--max-tokens", "1", stdin=b"hi\nab\xffcd\nnever sent\n")
    assert r.returncode == 2
    assert r.stderr.decode().endswith(f"x4ctl: line 2 of stdin is not UTF-8 text (0xff at byte 2; {BAD_UTF8}) "
                                      "(see x4ctl --help)\n"), r.stderr
    r = run(daemon.sock, "chat", "--max-tokens", "1", stdin=b"ab\0cd\n")
    assert r.returncode == 2
    assert r.stderr.decode() == "x4ctl: line 1 of stdin holds a NUL byte (at byte 2): text expected " \
                                "(see x4ctl --help)\n"


def test_stdin_that_cannot_be_read_is_not_empty(daemon, tmp_path):
    # both were "no prompt: stdin was empty"
    fd = os.open(tmp_path, os.O_RDONLY)
    r = subprocess.run([str(X4CTL), "--socket", daemon.sock, "generate"], stdin=fd, capture_output=True,
                       text=True, timeout=30)
    os.close(fd)
    assert r.returncode == 2
    assert r.stderr == "x4ctl: cannot read the prompt on stdin: Is a directory (give the prompt as " \
                       "arguments, or text on stdin)\n"
    r = subprocess.run([str(X4CTL), "--socket", daemon.sock, "generate"], stdin=subprocess.DEVNULL,
                       preexec_fn=lambda: os.close(0), capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "cannot read the prompt on stdin: Bad file descriptor" in r.stderr, r.stderr


def test_json_schema_folder_is_named(daemon, tmp_path):
    # it said "'[' or '{' expected near end of file (line 1, column 0)"
    r = run(daemon.sock, "generate", "--json-schema", str(tmp_path), "hi")
    assert r.returncode == 2
    assert r.stderr.decode() == f"x4ctl: --json-schema {tmp_path}: a folder; a file holding a JSON Schema " \
                                "expected\n"


def serve_once(path, answer):
    """A peer that is not xing4d: reads what comes, writes `answer` (b"": nothing), closes."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def one():
        c, _ = srv.accept()
        c.recv(4096)
        if answer:
            c.sendall(answer)
        c.close()
        srv.close()
    t = threading.Thread(target=one, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("answer,said", [
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
     "the peer does not speak the xing4d protocol: it answered the Hello handshake with 'HTTP/1.1 400 Bad'..., "
     "not a xing4d frame (an HTTP server: is this the bridge's or another service's socket?)"),
    (b"", "the peer does not speak the xing4d protocol: it read the Hello handshake and closed the connection "
          "without answering (xing4d answers it, or says why it refuses)"),
])
def test_a_peer_that_is_not_xing4d(tmp_path, answer, said):
    # both were "server closed the connection", exit 1
    path = str(tmp_path / "other.sock")
    t = serve_once(path, answer)
    r = subprocess.run([str(X4CTL), "--socket", path, "health"], capture_output=True, text=True, timeout=30)
    t.join(timeout=10)
    assert r.returncode == 3, r.stderr
    assert r.stderr == (f"x4ctl: {path}: {said}\n"
                        f"x4ctl: hint: {path} is another program's socket, not xing4d's: pass --socket PATH with "
                        "the path xing4d listens on (its --listen; the packaged one is /run/xing4d/xing4d.sock)\n")


def test_daemon_refusals_of_json_schema_name_the_file(daemon, tmp_path):
    # the daemon names constraint.json_schema; x4ctl's user gave --json-schema FILE
    import json
    s = {"type": "string"}
    for _ in range(130):  # valid JSON, 260 levels deep: more than the daemon's parser takes
        s = {"type": "object", "properties": {"a": s}}
    f = tmp_path / "deep.json"
    f.write_text(json.dumps(s))
    r = run(daemon.sock, "generate", "--json-schema", str(f), "hi")
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode()
    assert err.startswith(f"x4ctl: --json-schema {f}: too deeply nested for the daemon: its arrays and "
                          "objects nest more than 256 levels deep (line 1 column "), err
    assert err.endswith("), 256 at most\n") and "not valid JSON" not in err, err
    f.write_text(json.dumps({"type": "string", "minLength": 2}))
    r = run(daemon.sock, "generate", "--json-schema", str(f), "hi")
    assert r.returncode == 1
    assert r.stderr.decode().startswith(f"x4ctl: --json-schema {f}: keyword 'minLength' is not supported"), \
        r.stderr


# ---- permission denied: the hint says who may connect, from the socket's owner, group and mode ----

def as_nobody(sock, *args):
    """x4ctl run as nobody (uid/gid 65534, no other group): the side of a user the socket is not
    open to. Needs root (to change ids) and setpriv."""
    import shutil
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run x4ctl as another user")
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(X4CTL),
                           "--socket", sock, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def open_dir():
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="x4perm", dir="/tmp")  # pytest's tmp_path is closed to others
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


def bound_socket(path, uid, gid, mode):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(1)
    os.chown(path, uid, gid)
    os.chmod(path, mode)
    return s


def test_a_socket_only_its_owner_may_use_says_so(open_dir):
    # what xing4d --listen makes as root under umask 022: root:root 0755 (it said "is for members
    # of the group xing4: sudo usermod -aG xing4 ..." whatever the socket was)
    path = os.path.join(open_dir, "s.sock")
    s = bound_socket(path, 0, 0, 0o755)
    r = as_nobody(path, "health")
    s.close()
    assert r.returncode == 3, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == f"x4ctl: {path}: cannot connect: Permission denied", r.stderr
    assert lines[1].startswith(f"x4ctl: hint: {path} is owned by root (group root), mode 0755: only root can "
                               "connect. Run x4ctl as root, or open the socket to a group: "), r.stderr
    assert "umask" in lines[1] and "xing4" not in lines[1].split("packaged")[0], r.stderr


def test_a_group_socket_names_its_group(open_dir):
    import grp
    g = grp.getgrgid(1).gr_name  # "daemon" on Debian: any group but the caller's
    path = os.path.join(open_dir, "s.sock")
    s = bound_socket(path, 0, 1, 0o660)
    r = as_nobody(path, "health")
    s.close()
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines()[1] == (
        f"x4ctl: hint: {path} (owner root, group {g}, mode 0660) is for members of the group {g}: "
        f"sudo usermod -aG {g} nobody, then log in again (or run x4ctl as a member)"), r.stderr


def test_a_closed_folder_is_named(open_dir):
    inner = os.path.join(open_dir, "private")
    os.mkdir(inner, 0o700)
    path = os.path.join(inner, "s.sock")
    s = bound_socket(path, 0, 0, 0o666)
    r = as_nobody(path, "health")
    s.close()
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines()[1].startswith(
        f"x4ctl: hint: the folder {inner} (owner root, group root, mode 0700) is closed to nobody, so the "
        f"socket {path} in it is out of reach: run x4ctl as root"), r.stderr
