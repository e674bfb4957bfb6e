# SPDX-License-Identifier: MIT
"""x4ctl as a user meets it, against the scripted fake daemon: --help on every command, hints
when the daemon cannot be reached, the note (and exit 7) when the output budget ran out while
the model was still thinking, cancellation reported, and --json-schema FILE sent as the
request's Constraint (honouring it is the engine's part)."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import X4CTL, need


def x4ctl(sock, *args, stdin=None, timeout=30):
    need(X4CTL)
    return subprocess.run([str(X4CTL), "--socket", sock, *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def last_request(fake):
    return json.loads(fake["record"].read_text().splitlines()[-1])


@pytest.mark.parametrize("cmd", ["generate", "gen", "chat", "stats", "cancel", "snapshot", "info", "health"])
def test_help_on_every_command(cmd):
    r = x4ctl("/nonexistent.sock", cmd, "--help")
    assert r.returncode == 0 and r.stdout.startswith("Usage: x4ctl"), (r.stdout, r.stderr)
    assert r.stderr == ""


def test_connect_hints(tmp_path):
    r = x4ctl(str(tmp_path / "missing.sock"), "health")
    assert r.returncode == 3
    assert "cannot connect" in r.stderr and "systemctl start xing4d.socket" in r.stderr, r.stderr
    if os.geteuid() != 0:  # root passes the permission check
        sock = tmp_path / "locked.sock"
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(sock))
        s.listen(1)
        os.chmod(sock, 0)
        r = x4ctl(str(sock), "health")
        assert r.returncode == 3 and "group xing4" in r.stderr, r.stderr
        s.close()


def test_budget_spent_thinking_is_reported(fake):
    r = x4ctl(fake["socket"], "generate", "--max-tokens", "2", "think-long")
    assert r.returncode == 7, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert "ran out while the model was still thinking" in r.stderr and "--max-tokens" in r.stderr
    # with --no-think, reasoning the model emits anyway is its own doing: no note
    r = x4ctl(fake["socket"], "generate", "--no-think", "--max-tokens", "2", "think-long")
    assert r.returncode == 0 and "thinking" not in r.stderr, r.stderr
    # an answer cut by the budget is an answer: no note
    r = x4ctl(fake["socket"], "generate", "hi")
    assert r.returncode == 0 and r.stdout == "Hello, world\n" and "thinking" not in r.stderr


def test_cancel_elsewhere_is_reported(fake):
    r = x4ctl(fake["socket"], "generate", "cancelled-elsewhere")
    assert r.returncode == 0 and r.stdout == "Half\n", (r.stdout, r.stderr)
    assert "cancelled after 1 token (by x4ctl cancel" in r.stderr


def test_ctrl_c_cancels_and_says_so(fake):
    p = subprocess.Popen([str(X4CTL), "--socket", fake["socket"], "generate", "slow"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.read(6) == "Slowly"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=10)
    assert p.returncode == 130, err
    assert "cancelled after 1 token (Ctrl-C)" in err


def test_ctrl_c_before_any_output_cancels_at_once(fake):
    # a long prefill sends nothing: Ctrl-C must not wait for a first chunk
    before = len(fake["record"].read_text().splitlines()) if fake["record"].exists() else 0
    p = subprocess.Popen([str(X4CTL), "--socket", fake["socket"], "generate", "silent"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while (len(fake["record"].read_text().splitlines()) if fake["record"].exists() else 0) == before:
        assert time.monotonic() < deadline, "the request never reached the fake daemon"
        time.sleep(0.02)
    t = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=10)
    assert p.returncode == 130 and "cancelled after 1 token (Ctrl-C)" in err, (out, err)
    assert time.monotonic() - t < 3  # not the fake's 5 s wait


@pytest.mark.parametrize("json_mode", [False, True])
def test_closed_stdout_cancels_the_request(fake, json_mode):
    # x4ctl generate ... | head: once the reader is gone the request is cancelled and x4ctl ends,
    # quietly; it kept generating into the void up to --max-tokens (the fake waits 5 s for a Cancel)
    r, w = os.pipe()
    os.close(r)
    t = time.monotonic()
    p = subprocess.run([str(X4CTL), "--socket", fake["socket"], *(["--json"] if json_mode else []), "generate", "slow"],
                       stdout=w, stderr=subprocess.PIPE, text=True, timeout=30)
    os.close(w)
    assert time.monotonic() - t < 3, "the request was not cancelled"
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_stats_watch_ends_when_stdout_closes(fake):
    # x4ctl stats --watch | head: it looped forever writing into a closed pipe
    r, w = os.pipe()
    os.close(r)
    p = subprocess.run([str(X4CTL), "--socket", fake["socket"], "stats", "--watch=0.1"], stdout=w,
                       stderr=subprocess.PIPE, text=True, timeout=10)
    os.close(w)
    assert p.returncode == 0, p.stderr


def test_stats_watch_ctrl_c_is_the_normal_end_exit_0(fake):
    # documented (x4ctl stats --help, x4ctl(1)): Ctrl-C is how a watch ends, as with watch(1) and
    # journalctl -f; no request is cut short, so not 130 (which generate uses when Ctrl-C
    # cancels its request)
    p = subprocess.Popen([str(X4CTL), "--socket", fake["socket"], "stats", "--watch=0.1"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline()  # a first table is out: the handler is in place
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=10)
    assert p.returncode == 0 and err == "", (p.returncode, err)


def test_json_schema_file(fake, tmp_path):
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(schema))
    r = x4ctl(fake["socket"], "generate", "--json-schema", str(f), "q")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"answer": "yes"}
    assert last_request(fake)["constraint"] == {"json_schema": schema}
    f.write_text("{\"type\": ")
    r = x4ctl(fake["socket"], "generate", "--json-schema", str(f), "q")
    assert r.returncode == 2 and f"--json-schema {f}:" in r.stderr and "line 1" in r.stderr, r.stderr
    f.write_text("[1]")
    r = x4ctl(fake["socket"], "generate", "--json-schema", str(f), "q")
    assert r.returncode == 2 and "a JSON Schema object" in r.stderr
    r = x4ctl(fake["socket"], "generate", "--json-schema", str(tmp_path / "nope.json"), "q")
    assert r.returncode == 2 and "nope.json" in r.stderr
    # a file that cannot be opened has no position to report (it said "line -1, column -1")
    assert r.stderr == f"x4ctl: --json-schema {tmp_path / 'nope.json'}: unable to open {tmp_path / 'nope.json'}: " \
                       "No such file or directory\n", r.stderr


def test_health_takes_json_after_the_command_too(fake):
    # info and stats take --json after the command; health refused it as an unexpected argument
    before = x4ctl(fake["socket"], "--json", "health")
    after = x4ctl(fake["socket"], "health", "--json")
    assert before.returncode == after.returncode == 0, (before.stderr, after.stderr)
    assert json.loads(after.stdout) == json.loads(before.stdout) and json.loads(after.stdout)["status"] == "serving"
    r = x4ctl(fake["socket"], "health", "--jsn")
    assert r.returncode == 2 and "health: unexpected argument '--jsn'" in r.stderr


def test_help_lists_every_option_of_the_man_page():
    # x4ctl --help is where a user looks first: every option man/x4ctl.1 documents is named there
    # (--no-mtp was missing)
    import re
    from conftest import SRC
    need(X4CTL)
    man = (SRC / "man" / "x4ctl.1").read_text()
    # the option items: lines ".B \-\-name" / ".BI \-\-name ARG ..." (several options on some)
    items = [line for line in man.splitlines() if re.match(r"\.BI? \\-\\-", line)]
    documented = {m.replace("\\-", "-") for line in items for m in re.findall(r"\\-\\-((?:[a-z]|\\-)+)", line)}
    assert "no-mtp" in documented and "json-schema" in documented, documented
    r = subprocess.run([str(X4CTL), "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0
    missing = sorted(d for d in documented if f"--{d}" not in r.stdout)
    assert not missing, missing


def test_option_errors_name_x4ctl_and_the_command():
    # getopt named argv[0]: "generate: unrecognized option" or "/usr/bin/x4ctl: ..."
    need(X4CTL)
    for args, want in ((["generate", "--bogus"], "x4ctl generate: unrecognized option '--bogus'"),
                       (["generate", "--max-tokens"], "x4ctl generate: option '--max-tokens' requires an argument"),
                       (["snapshot", "create", "--bogus", "x"], "x4ctl snapshot create: unrecognized option '--bogus'"),
                       (["--bogus", "health"], "x4ctl: unrecognized option '--bogus'")):
        r = subprocess.run([str(X4CTL), *args], capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and r.stderr.startswith(want), (args, r.stderr)


@pytest.mark.parametrize("args,stdin,needle", [
    (["generate", "-", "extra"], "hi", "'-' (the prompt on stdin) and a prompt on the command line ('extra') exclude"),
    (["generate", "--raw", "--system", "S", "hi"], None, "--system needs the chat template"),
    (["generate"], "", "no prompt: stdin was empty"),
    (["generate"], " \n\t", "no prompt: stdin held only blanks"),
    (["generate", " "], None, "no prompt: the prompt given is blank"),
    (["generate", "--raw"], "a\0b", "holds a NUL byte (at byte 1)"),
    (["chat", "--raw"], "x\n", "chat: --raw is for generate"),
    (["chat", "--tokens", "1,2"], "x\n", "chat: --tokens is for generate"),
    (["snapshot", "create", "s", "--tokens", "1,2", "text"], None, "--tokens and a text prompt ('text') exclude"),
    (["snapshot", "create", "s", "--raw", "--system", "S", "t"], None, "--system needs the chat template"),
])
def test_conflicting_or_empty_input_is_a_usage_error(fake, args, stdin, needle):
    """Input x4ctl would otherwise drop without a word: refused before anything is sent."""
    r = x4ctl(fake["socket"], *args, stdin=stdin)
    assert r.returncode == 2 and needle in r.stderr, (r.returncode, r.stderr)


def test_json_failures_are_json_and_timeout_zero_is_none(fake, tmp_path):
    r = x4ctl(str(tmp_path / "missing.sock"), "--json", "generate", "hi")
    assert r.returncode == 3
    e = json.loads(r.stdout)
    assert e["type"] == "error" and "cannot connect" in e["message"], r.stdout
    r = x4ctl(fake["socket"], "--timeout", "0", "generate", "--no-think", "hi")
    assert r.returncode == 0 and "Hello, world" in r.stdout, (r.stdout, r.stderr)


def test_raw_blank_text_is_sent_as_it_is(fake):
    r = x4ctl(fake["socket"], "generate", "--raw", " ")
    assert r.returncode == 0, r.stderr


def test_a_socket_path_that_is_no_socket_is_named(tmp_path):
    r = x4ctl(str(tmp_path), "health")
    assert r.returncode == 3 and f"{tmp_path} is a folder, not a socket" in r.stderr, r.stderr
    r = x4ctl("", "health")
    assert r.returncode == 2 and "--socket: an empty path" in r.stderr, r.stderr
