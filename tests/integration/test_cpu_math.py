# SPDX-License-Identifier: MIT
"""xing4d --cpu-math fast (kernels/cpu/quant.h, xing4d(8)): the CPU backend's fast numerics serve
through the daemon with the contract of the reference numerics: a request's greedy tokens are the
same alone, repeated, and beside other requests of other lengths (batch invariance); the trained
demo model still answers in words; bad values are refused naming the flag. On a CPU without
AVX-512 the fast numerics fall back to the reference and the same assertions hold."""
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import DEFAULT_CONF, DEVICE, XING4D, Daemon

SRC = Path(__file__).resolve().parents[2]
DEMO = SRC / "models" / "xing4-demo" / "model.gguf"


def gen(d, prompt, n=24):
    r = d.x4ctl("--json", "generate", "--raw", "--temperature", "0", "--max-tokens", str(n),
                "--ignore-eos", prompt, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[-1]["type"] == "done", lines[-1]
    return [t for x in lines if x.get("type") == "chunk" for t in x["token_ids"]]


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    if DEVICE != "cpu":
        pytest.skip("--cpu-math is the CPU backend's setting")
    if not DEMO.exists():
        pytest.skip(f"{DEMO} is not in this tree (the trained demo model)")
    d = Daemon(tmp_path_factory.mktemp("fast"), DEFAULT_CONF,
               args=("--model", str(DEMO), "--cpu-math", "fast"))
    yield d
    d.close()


def test_fast_numerics_are_batch_invariant(fast):
    prompts = ["What does tar do?", "Explain grep in one line, please, with an example.", "Hi"]
    alone = [gen(fast, p) for p in prompts]
    assert all(len(a) == 24 for a in alone), alone
    assert gen(fast, prompts[0]) == alone[0]
    together = [None] * len(prompts)

    def one(i):
        together[i] = gen(fast, prompts[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


def test_fast_numerics_answer_in_words(fast):
    r = fast.x4ctl("generate", "--no-think", "--temperature", "0", "--max-tokens", "48",
                   "What does grep do?", timeout=120)
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    assert len(words) >= 5 and sum(w.isalpha() for w in words) >= 3, r.stdout


@pytest.mark.parametrize("value", ["q8", "FAST", ""])
def test_bad_cpu_math_names_the_flag(tmp_path, value):
    r = subprocess.run([str(XING4D), "--config", "/dev/null", "--device", "cpu",
                        "--model", str(DEMO), "--listen", str(tmp_path / "x.sock"),
                        "--cpu-math", value], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert f"--cpu-math: '{value}', fp32 or fast expected" in r.stderr, r.stderr


def _serving_line(d):
    deadline = time.monotonic() + 10  # the log reader thread may trail READY=1
    while time.monotonic() < deadline:
        lines = [x for x in d.log if "serving " in x and " cache pages of " in x]
        if lines:
            return lines[0]
        time.sleep(0.05)
    pytest.fail(f"no 'serving' line in the log: {d.log[-20:]}")


def test_fast_is_the_default_and_fp32_is_asked_for(tmp_path):
    """Serving defaults to the fast numerics (issue 18: the default for serving where it is
    faster); --cpu-math fp32 gives the reference, and the log says which one runs."""
    if DEVICE != "cpu":
        pytest.skip("--cpu-math is the CPU backend's setting")
    d = Daemon(tmp_path / "default", DEFAULT_CONF)
    try:
        assert "(fast numerics)" in _serving_line(d)
    finally:
        d.close()
    d = Daemon(tmp_path / "fp32", DEFAULT_CONF, args=("--cpu-math", "fp32"))
    try:
        line = _serving_line(d)
        assert " on cpu" in line and "(fast numerics)" not in line, line
    finally:
        d.close()
