# SPDX-License-Identifier: MIT
"""What a new user gets wrong at start, found by a black-box audit: each is said before the model
load (minutes for the release's file) or refused instead of quietly changed: a zero queue, a
memory limit the model cannot fit in, the snapshot folder, a --listen folder that is a file, a
tokenizer folder that does not exist, config files with repeated keys, comments after values and a
byte order mark."""
import subprocess
import time

from conftest import DEFAULT_CONF, MODEL, XING4D, Daemon


def run_xing4d(*args, timeout=60):
    return subprocess.run([str(XING4D), "--model", str(MODEL), "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_max_waiting_zero_means_no_queue(tmp_path):
    d = Daemon(tmp_path / "q", DEFAULT_CONF.replace("max-running = 4", "max-running = 1"),
               args=("--max-waiting", "0"))
    try:
        long = d.x4ctl_popen("generate", "--raw", "--ignore-eos", "--max-tokens", "100000", "Once")
        d.wait_stats(lambda s: s["requests_running"] == 1, what="the first request running")
        t0 = time.monotonic()
        r = d.x4ctl("generate", "--raw", "--max-tokens", "2", "Hi")
        assert r.returncode == 6 and time.monotonic() - t0 < 10, (r.returncode, r.stderr)
        long.kill()
        long.wait()
    finally:
        d.close()


def test_a_memory_limit_below_the_model_is_refused(tmp_path):
    r = run_xing4d("--config", "/dev/null", "--listen", str(tmp_path / "x.sock"), "--state-dir", str(tmp_path),
                   "--memory-limit", "1k")
    assert r.returncode == 1, r.stderr
    assert "the memory limit of 1024 bytes" in r.stderr and "cannot hold the model file" in r.stderr, r.stderr
    # suffixes in either case
    r = run_xing4d("--config", "/dev/null", "--listen", str(tmp_path / "x.sock"), "--state-dir", str(tmp_path),
                   "--memory-limit", "1t", "--max-frame", "abc")
    assert "--memory-limit" not in r.stderr and "--max-frame: 'abc' is not a size" in r.stderr, r.stderr
    # max-frame takes a size too (the packaged file's comment says 16 MiB)
    r = run_xing4d("--config", "/dev/null", "--listen", str(tmp_path / "x.sock"), "--state-dir", str(tmp_path),
                   "--memory-limit", "1k", "--max-frame", "16M")
    assert "--max-frame" not in r.stderr and "the memory limit of 1024 bytes" in r.stderr, r.stderr


def test_the_state_dir_is_made_or_said_at_start(tmp_path):
    # missing: created (its parent exists); a file: refused before the load; no parent: a warning
    state = tmp_path / "state"
    d = Daemon(tmp_path / "d", DEFAULT_CONF.replace("cache-pages", "state-dir = " + str(state) + "\ncache-pages"))
    d.close()
    (tmp_path / "file").write_text("x")
    r = run_xing4d("--config", "/dev/null", "--listen", str(tmp_path / "x.sock"),
                   "--state-dir", str(tmp_path / "file"))
    assert r.returncode == 1 and f"--state-dir {tmp_path / 'file'}: exists and is not a folder" in r.stderr, r.stderr
    assert "chat template" not in r.stderr, r.stderr


def test_a_listen_folder_that_is_a_file_is_named(tmp_path):
    (tmp_path / "plain").write_text("x")
    r = run_xing4d("--config", "/dev/null", "--listen", str(tmp_path / "plain" / "x.sock"),
                   "--state-dir", str(tmp_path))
    assert r.returncode == 1 and f"{tmp_path / 'plain'} is not a folder" in r.stderr, r.stderr


def test_a_missing_tokenizer_folder_is_an_error(tmp_path):
    r = run_xing4d("--config", "/dev/null", "--listen", str(tmp_path / "x.sock"), "--state-dir", str(tmp_path),
                   "--tokenizer-path", str(tmp_path / "nope"))
    assert r.returncode == 1 and f"tokenizer path {tmp_path / 'nope'}: no such folder" in r.stderr, r.stderr


def test_config_file_details(tmp_path):
    # a byte order mark, a comment after a value, a key set twice (warned, the later wins)
    conf = tmp_path / "c.conf"
    conf.write_bytes(b"\xef\xbb\xbf[xing4d]\nthreads = 1\nmax-running = 3  # a comment\nthreads = 2 ; again\n"
                     b"max-frame = abc\n")
    r = run_xing4d("--config", str(conf), "--listen", str(tmp_path / "x.sock"), "--state-dir", str(tmp_path))
    assert f"{conf}:4: 'threads' is set again (line 2 set it before)" in r.stderr, r.stderr
    # the file was read past the comments: the bad value on line 5 is what stops it
    assert r.returncode == 1 and f"{conf}:5" in r.stderr and "'key = value' expected" not in r.stderr, r.stderr
    # a path holding " #1" or " ;x" (no space after the mark) is a value, not a comment
    conf.write_text(f"[xing4d]\nstate-dir = {tmp_path}/s #1\nmemory-limit = 1k  # too small: it stops\n")
    r = run_xing4d("--config", str(conf), "--listen", str(tmp_path / "x.sock"))
    assert r.returncode == 1 and "the memory limit of 1024 bytes" in r.stderr, r.stderr
    assert (tmp_path / "s #1").is_dir(), r.stderr


def test_more_threads_than_cpus_is_warned(tmp_path):
    """--threads above the CPU count serves (correctly, as the invariance tests show) but slowly:
    every product waits for its slowest thread. The log says so at start."""
    import os
    d = Daemon(tmp_path / "d", DEFAULT_CONF, args=("--threads", str(os.cpu_count() + 3)))
    try:
        deadline = time.monotonic() + 10
        while not any("more threads than CPUs" in x for x in d.log) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(f"{os.cpu_count() + 3} threads on" in x and "more threads than CPUs" in x for x in d.log), d.log
        assert d.x4ctl("health").returncode == 0
    finally:
        d.close()


def test_a_gguf_without_weights_is_named_as_such(tmp_path):
    """A vocabulary-only GGUF (the tokenizer tests' file) is not a model: said so, not a missing key."""
    from conftest import SRC
    vocab = SRC / "tests" / "tokenizer" / "spm-bpe8k.gguf"
    r = run_xing4d("--config", "/dev/null", "--model", str(vocab), "--listen", str(tmp_path / "x.sock"),
                   "--state-dir", str(tmp_path))
    assert r.returncode == 1
    assert f"{vocab}: holds no tensors" in r.stderr and "with its weights expected" in r.stderr, r.stderr
