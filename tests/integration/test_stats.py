# SPDX-License-Identifier: MIT
"""The request counters of the daemon's stats add up (x4ctl(1), proto/xing4.proto StatsReply):
every request received is in requests_total, and ends in exactly one of completed, failed,
cancelled or refused; until then it is in flight. A refusal for a full queue is counted (it was
counted nowhere), a request cancelled while queued is counted once among the received (the
review saw "1 total, 0 failed, 2 cancelled"), and the daemon's log tells a client's request id
from the server's."""
import re
import signal

import pytest

LONG = ("generate", "--tokens", "5,6,7,8", "--ignore-eos", "--max-tokens", "100000")


def adds_up(s):
    return s["requests_total"] == (s["requests_completed"] + s["requests_failed"] +
                                   s["requests_cancelled"] + s["requests_refused"] +
                                   s["requests_in_flight"])


def counts(s):
    return {k: s["requests_" + k] for k in
            ("total", "completed", "failed", "cancelled", "refused", "queue_full", "in_flight")}


@pytest.fixture
def small_queue(fresh_daemon):
    return fresh_daemon(args=("--max-running", "1", "--max-waiting", "1"))


def test_counters_add_up_through_queue_full_and_cancels(small_queue):
    d = small_queue
    s = d.stats()
    assert counts(s) == dict(total=0, completed=0, failed=0, cancelled=0, refused=0, queue_full=0,
                             in_flight=0)
    running = d.x4ctl_popen(*LONG)
    d.wait_stats(lambda s: s["requests_running"] == 1, what="the first stream running")
    queued = d.x4ctl_popen(*LONG)
    d.wait_stats(lambda s: s["requests_waiting"] == 1, what="the second stream queued")
    r = d.x4ctl(*LONG)
    assert r.returncode == 6, r.stderr  # unavailable: the queue is full
    assert "the request queue is full" in r.stderr
    s = d.stats()
    assert counts(s) == dict(total=3, completed=0, failed=0, cancelled=0, refused=1, queue_full=1,
                             in_flight=2), s
    # the queued one's client goes away: cancelled before it started, counted once
    queued.send_signal(signal.SIGKILL)
    queued.wait(timeout=30)
    s = d.wait_stats(lambda s: s["requests_cancelled"] == 1, what="the queued request cancelled")
    assert counts(s) == dict(total=3, completed=0, failed=0, cancelled=1, refused=1, queue_full=1,
                             in_flight=1), s
    running.send_signal(signal.SIGKILL)
    running.wait(timeout=30)
    s = d.wait_stats(lambda s: s["requests_in_flight"] == 0, what="the running request cancelled")
    assert counts(s) == dict(total=3, completed=0, failed=0, cancelled=2, refused=1, queue_full=1,
                             in_flight=0), s
    # one refused by validation, one refused by the engine (no such snapshot), one completed
    r = d.x4ctl("generate", "--tokens", "5,99999")
    assert r.returncode == 1, r.stderr
    r = d.x4ctl("generate", "--snapshot", "nosuch", "--tokens", "5,6")
    assert r.returncode == 5, r.stderr
    r = d.x4ctl("generate", "--tokens", "5,6", "--max-tokens", "2")
    assert r.returncode == 0, r.stderr
    s = d.wait_stats(lambda s: s["requests_in_flight"] == 0, what="all ended")
    assert counts(s) == dict(total=6, completed=1, failed=0, cancelled=2, refused=3, queue_full=1,
                             in_flight=0), s
    assert adds_up(s)
    r = d.x4ctl("stats")
    assert r.returncode == 0, r.stderr
    assert "requests        0 running, 0 waiting\n" in r.stdout, r.stdout
    assert ("received        6: 1 completed, 0 failed, 2 cancelled, 3 refused (1 queue full), "
            "0 in flight\n") in r.stdout, r.stdout


def test_counters_add_up_while_requests_come_and_go(small_queue):
    d = small_queue
    procs = [d.x4ctl_popen("generate", "--tokens", "5,6,7", "--ignore-eos", "--max-tokens", "40")
             for _ in range(4)]
    seen = 0
    while any(p.poll() is None for p in procs) or seen < 3:
        s = d.stats()
        assert adds_up(s), counts(s)
        seen += 1
    for p in procs:
        p.communicate(timeout=60)
    s = d.wait_stats(lambda s: s["requests_in_flight"] == 0, what="all ended")
    assert adds_up(s) and s["requests_total"] == 4, counts(s)
    assert s["requests_completed"] + s["requests_queue_full"] == 4, counts(s)


def test_the_log_tells_client_ids_from_server_ids(small_queue):
    d = small_queue
    r = d.x4ctl("generate", "--tokens", "5,99999")  # refused before it gets a server id
    assert r.returncode == 1
    r = d.x4ctl("--json", "generate", "--snapshot", "nosuch", "--tokens", "5,6")  # by the engine
    assert r.returncode == 5
    d.wait_stats(lambda s: s["requests_refused"] == 2, what="both refused")
    refused = [x for x in d.log if "refused" in x]
    assert any(re.search(r"client request \d+ on connection \d+ \(pid \d+\) refused: prompt\.tokens\[1\]", x)
               for x in refused), refused
    # the second got a server id: both ids, each named as what it is
    assert any(re.search(r"request \d+ \(client request \d+ on connection \d+, pid \d+\) refused: "
                         r"snapshot 'nosuch'", x) for x in refused), refused
    # "request N" alone is only ever a server id
    assert not any(re.search(r"(?<!client )request \d+ refused", x) for x in d.log), d.log
