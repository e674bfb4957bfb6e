# SPDX-License-Identifier: MIT
"""xing4-http's INI file and flags: settings take effect, flags override the file, mistakes are
refused with the file, line and what was expected."""
import re
import subprocess

from conftest import HTTP, Bridge, chat, need


def run_http(*args):
    need(HTTP)
    return subprocess.run([str(HTTP), *args], capture_output=True, text=True, timeout=30)


def test_config_file_settings_apply(daemon, tmp_path):
    conf = tmp_path / "xing4-http.conf"
    conf.write_text("# test\n[xing4-http]\nlisten = 127.0.0.1:1\n"
                    f"socket = {daemon.sock}\nmodel-name = house-model\nmax-body-bytes = 1500\n")
    # --listen on the command line overrides the file's (unusable) port 1
    b = Bridge([], "--config", str(conf))
    try:
        # Bridge() passes --config /dev/null first; the later --config wins, as getopt reads both
        st, _, body = b.request("GET", "/v1/models")
        assert st == 200 and body["data"][0]["id"] == "house-model"
        st, _, body = b.post("/v1/chat/completions", chat("x" * 2000, model="house-model"))
        assert st == 413 and "limit of 1500 bytes" in body["error"]["message"]
        st, _, body = b.post("/v1/chat/completions", chat("hi", model="house-model", max_tokens=2))
        assert st == 200, body
    finally:
        b.close()


def test_config_mistakes_are_named(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text("[xing4-http]\nlisten = 127.0.0.1:0\nmax-concurrent = lots\n")
    r = run_http("--config", str(conf))
    assert r.returncode == 2
    assert f'{conf}:3: max-concurrent: "lots" is not a positive integer' in r.stderr
    conf.write_text("[xing4-http]\ncolour = blue\n")
    r = run_http("--config", str(conf))
    assert r.returncode == 2 and f'{conf}:2: unknown setting "colour"' in r.stderr
    conf.write_text("[server]\n")
    r = run_http("--config", str(conf))
    assert r.returncode == 2 and "section [server]: [xing4-http] expected" in r.stderr
    r = run_http("--config", str(tmp_path / "missing.conf"))
    assert r.returncode == 2 and "missing.conf: cannot open the config file" in r.stderr
    r = run_http("--config", "/dev/null", "--listen", "localhost")
    assert r.returncode == 2 and "--listen localhost: HOST:PORT expected" in r.stderr
    # empty values are named, not kept (an empty socket made every request a 503)
    for key in ("socket", "listen"):
        conf.write_text(f"[xing4-http]\n{key} =\n")
        r = run_http("--config", str(conf))
        assert r.returncode == 2 and f"{conf}:2: {key}: empty value" in r.stderr, r.stderr
    r = run_http("--config", "/dev/null", "--socket", "")
    assert r.returncode == 2 and "--socket: socket: empty value" in r.stderr, r.stderr
    # no host at all, and a host that does not resolve (it said "cannot listen there: Success")
    r = run_http("--config", "/dev/null", "--listen", ":8000")
    assert r.returncode == 2 and "--listen :8000: HOST:PORT expected" in r.stderr
    r = run_http("--config", "/dev/null", "--listen", "no-such-host.invalid:0", "--socket", str(tmp_path / "s"))
    assert r.returncode == 1
    assert "--listen no-such-host.invalid:0: cannot listen there: the host does not resolve" in r.stderr
    assert "Success" not in r.stderr
    r = run_http("--config", "/dev/null", "--api-key-file", str(tmp_path / "nokey"))
    assert r.returncode == 2 and "nokey: cannot read the API key file" in r.stderr


def test_ipv6_listen_address_is_logged_as_given(tmp_path):
    # the log line printed [::] whatever IPv6 address was asked for
    import socket
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        import pytest
        pytest.skip("no IPv6 loopback here")
    p = subprocess.Popen([str(HTTP), "--config", "/dev/null", "--listen", "[::1]:0", "--socket", str(tmp_path / "s")],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stderr:
            if "listening on" in line:
                assert re.search(r"listening on http://\[::1\]:\d+/v1 ", line), line
                break
        else:
            raise AssertionError("no listening line")
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_version_and_help():
    r = run_http("--version")
    assert r.returncode == 0 and re.fullmatch(r"xing4-http \d+\.\d+\.\d+\n", r.stdout)
    r = run_http("--help")
    assert r.returncode == 0 and "--socket PATH" in r.stdout and "--api-key-file" in r.stdout
