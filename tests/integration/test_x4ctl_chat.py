# SPDX-License-Identifier: MIT
"""x4ctl chat when Ctrl-C cuts an answer: the cut answer stays in the history sent with the next
turn, as far as it came and marked "[interrupted by the user]" (it was kept as if complete), and
Ctrl-C at the prompt does not end the chat on a terminal. A turn the daemon refuses (the
conversation over the context, an invalid parameter, a failure after the first token) or that got
no answer (the budget spent thinking) is left out of the history and the chat goes on (it used to
end the chat, or keep an empty answer); /reset starts the conversation over; a lost connection
still ends it. Against the scripted daemon of tests/bridge/fakedaemon.py (the exact history each
turn sends) through a pseudo-terminal and a pipe, and against the real daemon."""
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import termios
import time

import pytest

from conftest import SRC, X4CTL

sys.path.insert(0, str(SRC / "tests" / "bridge"))
import fakedaemon  # noqa: E402

MARK = "[interrupted by the user]"


@pytest.fixture
def fake(tmp_path):
    sock, record = str(tmp_path / "fake.sock"), tmp_path / "record.jsonl"
    srv = fakedaemon.serve(sock, str(record))
    yield {"socket": sock, "record": record}
    srv.close()


def requests(fake):
    return [json.loads(x) for x in fake["record"].read_text().splitlines()]


class Pty:
    """x4ctl on a pseudo-terminal that is its controlling terminal: ^C there is a real SIGINT."""

    def __init__(self, *args):
        master, slave = os.openpty()
        self.master = master
        self.out = b""
        self.proc = subprocess.Popen(
            [str(X4CTL), *args], stdin=slave, stdout=slave, stderr=subprocess.PIPE,
            start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        os.close(slave)

    def expect(self, needle, timeout=10):
        deadline = time.monotonic() + timeout
        while needle.encode() not in self.out:
            left = deadline - time.monotonic()
            assert left > 0, f"no {needle!r} in {self.out!r}"
            if select.select([self.master], [], [], left)[0]:
                try:
                    self.out += os.read(self.master, 4096)
                except OSError:  # EIO: the other side is closed
                    break
        assert needle.encode() in self.out, self.out
        i = self.out.index(needle.encode()) + len(needle)
        self.out = self.out[i:]

    def send(self, data):
        os.write(self.master, data.encode())

    def close(self):
        stderr = self.proc.communicate(timeout=10)[1].decode()
        os.close(self.master)
        return self.proc.returncode, stderr


def test_ctrl_c_on_a_terminal_keeps_the_cut_answer_marked(fake):
    t = Pty("--socket", fake["socket"], "chat")
    t.expect("> ")
    t.send("slow\n")
    t.expect("Slowly")          # the answer is streaming: the fake waits for a Cancel
    t.send("\x03")              # ^C: SIGINT to x4ctl
    t.expect("> ")              # the chat goes on
    time.sleep(0.2)             # it is reading the next line (not between the prompt and the read)
    t.send("\x03")              # ^C at the prompt: a new prompt, not the end
    t.expect("> ")
    t.send("hi\n")
    t.expect("Hello, world")
    t.expect("> ")
    t.send("\x04")              # ^D ends it
    rc, err = t.close()
    assert rc == 0, err
    assert "x4ctl: cancelled after 1 token (Ctrl-C); the conversation keeps the answer so far, marked " \
           f"{MARK}\n" in err, err
    assert "x4ctl: Ctrl-D ends the chat; Ctrl-C only stops an answer" in err, err
    reqs = requests(fake)
    assert len(reqs) == 2, reqs
    assert reqs[1]["messages"] == [{"role": "user", "content": "slow"},
                                   {"role": "assistant", "content": f"Slowly\n{MARK}"},
                                   {"role": "user", "content": "hi"}]


def test_ctrl_c_with_stdin_a_pipe(fake):
    p = subprocess.Popen([str(X4CTL), "--socket", fake["socket"], "--json", "chat"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdin.write("silent\n")   # cut before any text came (a long prefill)
    p.stdin.flush()
    deadline = time.monotonic() + 10
    while not fake["record"].exists():
        assert time.monotonic() < deadline, "the turn never reached the fake daemon"
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    assert json.loads(p.stdout.readline())["finish_reason"] == "cancelled"
    p.stdin.write("hi\n")
    p.stdin.flush()
    lines = []
    while not lines or lines[-1]["type"] != "done":
        lines.append(json.loads(p.stdout.readline()))
    assert lines[-1]["finish_reason"] == "stop"
    time.sleep(0.3)             # back at its prompt
    # Ctrl-C at the prompt with no terminal to clear a line on: the chat ends, as interrupted
    p.send_signal(signal.SIGINT)
    p.wait(timeout=10)          # stdin still open: the signal alone ends it
    _, err = p.communicate(timeout=10)
    assert p.returncode == 130, err
    reqs = requests(fake)
    assert reqs[1]["messages"] == [{"role": "user", "content": "silent"},
                                   {"role": "assistant", "content": MARK},
                                   {"role": "user", "content": "hi"}]


def test_cut_turns_on_the_real_daemon(daemon):
    def cut_turn(p, text):
        p.stdin.write(text + "\n")
        p.stdin.flush()
        first = json.loads(p.stdout.readline())
        assert first["type"] == "chunk", first
        p.send_signal(signal.SIGINT)
        lines = [first]
        while lines[-1]["type"] != "done":
            lines.append(json.loads(p.stdout.readline()))
        assert lines[-1]["finish_reason"] == "cancelled"
        return lines[-1]["usage"]["prompt_tokens"]

    p = subprocess.Popen([str(X4CTL), "--socket", daemon.sock, "--json", "chat", "--temperature", "0",
                          "--ignore-eos"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    first = cut_turn(p, "hello")
    second = cut_turn(p, "again")   # the chat went on after the cut turn
    _, err = p.communicate(timeout=60)  # closes stdin: the end of the chat
    assert p.returncode == 0, err
    # the second prompt holds the first turn with its cut answer and the mark
    assert second > first + len("again"), (first, second)
    assert err.count(f"the conversation keeps the answer so far, marked {MARK}") == 2, err
    assert daemon.stats()["cache_pages_used"] == 0


SYSTEM = {"role": "system", "content": "fake-context-4000"}
ANSWER = "Hello, world"


def turn(text):
    return [{"role": "user", "content": text}, {"role": "assistant", "content": ANSWER}]


def test_a_full_context_on_a_terminal_keeps_the_chat(fake):
    # the fake refuses a conversation over 4000 bytes as xing4d one over its context (TOO_LARGE)
    t = Pty("--socket", fake["socket"], "chat", "--system", "fake-context-4000")
    for ch in "abc":
        t.expect("> ")
        t.send(ch * 1000 + "\n")
        t.expect(ANSWER)
    t.expect("> ")
    t.send("d" * 1000 + "\n")  # 4053 bytes with the history: refused
    t.expect("> ")              # the chat goes on
    t.send("hi\n")              # a shorter question fits
    t.expect(ANSWER)
    t.expect("> ")
    t.send("/reset\n")          # starts over (the --system message stays)
    t.expect("> ")
    t.send("hi\n")
    t.expect(ANSWER)
    t.expect("> ")
    t.send("\x04")
    rc, err = t.close()
    assert rc == 0, err         # on a terminal the user saw the refusal and went on
    assert "x4ctl: prompt of 4053 tokens leaves no room for output in the context limit of 4000 tokens\n" \
           in err, err
    assert "x4ctl: hint: the conversation no longer fits the model's context with this question: type " \
           "/reset to start it over (the --system message stays), or ask something shorter\n" in err, err
    assert "x4ctl: the question is left out of the conversation\n" in err, err
    assert "x4ctl: the conversation starts over (the --system message stays)\n" in err, err
    reqs = requests(fake)
    assert len(reqs) == 6, reqs  # "/reset" is no turn
    assert reqs[3]["messages"][-1] == {"role": "user", "content": "d" * 1000}
    # the refused question is not in the history; the earlier turns are
    assert reqs[4]["messages"] == [SYSTEM, *turn("a" * 1000), *turn("b" * 1000), *turn("c" * 1000),
                                   {"role": "user", "content": "hi"}]
    assert reqs[5]["messages"] == [SYSTEM, {"role": "user", "content": "hi"}]


def test_refused_turns_in_a_script_go_on_and_fail_at_the_end(fake):
    p = subprocess.run([str(X4CTL), "--socket", fake["socket"], "--json", "chat"],
                       input="hi\nerror-invalid\nerror-after-start\nagain\n", capture_output=True,
                       text=True, timeout=30)
    # every line was sent and answered in order; the status says that a turn failed (the first
    # failed turn's: 1, a refusal)
    assert p.returncode == 1, p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    ends = [x for x in lines if x["type"] in ("done", "error")]
    assert [x["type"] for x in ends] == ["done", "error", "error", "done"], lines
    # the field the daemon names (sampling.top_k) is said as the option that sets it
    assert ends[1]["message"] == "--top-k: scripted refusal"
    assert ends[2]["message"] == "scripted failure after the first token"
    assert "x4ctl: --top-k: scripted refusal\n" in p.stderr, p.stderr
    assert p.stderr.count("x4ctl: the question is left out of the conversation; the chat goes on with the "
                          "next line and ends with exit status 1\n") == 2, p.stderr
    reqs = requests(fake)
    assert len(reqs) == 4, reqs
    # neither the refused question nor the one whose answer failed half-way is kept
    assert reqs[3]["messages"] == [*turn("hi"), {"role": "user", "content": "again"}]


def test_reset_in_a_script(fake):
    p = subprocess.run([str(X4CTL), "--socket", fake["socket"], "chat"], input="hi\n/reset\nagain\n",
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"{ANSWER}\n{ANSWER}\n"
    reqs = requests(fake)
    assert [r["messages"] for r in reqs] == [[{"role": "user", "content": "hi"}],
                                             [{"role": "user", "content": "again"}]]


def test_a_lost_connection_still_ends_the_chat(fake):
    p = subprocess.run([str(X4CTL), "--socket", fake["socket"], "chat"], input="hi\nhang-up\nnever sent\n",
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1, p.stderr
    assert "server closed the connection" in p.stderr, p.stderr
    assert "left out of the conversation" not in p.stderr, p.stderr
    assert len(requests(fake)) == 2


def test_budget_spent_thinking_keeps_no_empty_answer(fake):
    p = subprocess.run([str(X4CTL), "--socket", fake["socket"], "chat"], input="think-long\nhi\n",
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 7, p.stderr  # a script learns that a turn got no answer
    assert p.stdout == f"{ANSWER}\n"
    assert "x4ctl: the output budget (2 tokens) ran out while the model was still thinking; nothing was " \
           "answered." in p.stderr, p.stderr
    assert "x4ctl: the question is left out of the conversation; the chat goes on with the next line and " \
           "ends with exit status 7\n" in p.stderr, p.stderr
    reqs = requests(fake)
    # no empty assistant turn, and no question left without its answer
    assert reqs[1]["messages"] == [{"role": "user", "content": "hi"}]
