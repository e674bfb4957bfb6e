# SPDX-License-Identifier: MIT
"""Every error the bridge answers: OpenAI's shape {"error": {message, type, param, code}}, the
HTTP status an SDK maps to its exception class, Retry-After where retrying helps, and a message
naming the field and what was expected."""
import json
import socket
import threading
import time

import pytest

from conftest import Daemon, assert_openai_error, chat


# ---- 400: the request itself ------------------------------------------------------------------

def test_invalid_json_is_400_with_position(bridge):
    st, _, body = bridge.post("/v1/chat/completions", b'{"model": "xing4", "messages": [}')
    e = assert_openai_error(st, body, 400, "not valid JSON")
    assert "line 1" in e["message"] and e["type"] == "invalid_request_error"


def test_an_integer_past_64_bits_is_said_to_be_one(bridge):
    """A max_tokens of 2^63 is valid JSON: the error says the integer is out of range, not that the
    body is not JSON."""
    st, _, body = bridge.post("/v1/chat/completions",
                              b'{"model": "xing4", "max_tokens": 9223372036854775808, "messages": []}')
    e = assert_openai_error(st, body, 400, "the integer at line 1, column")
    assert "out of range" in e["message"] and "not valid JSON" not in e["message"], e


@pytest.mark.parametrize("seed", ["18446744073709551615", "9223372036854775808", "9223372036854775807", "0"])
def test_a_seed_takes_the_whole_uint64_range(fake_bridge, fake, seed):
    """The protocol's seed is a uint64: seeds past 2^63 (beyond jansson's int64) reach the daemon as
    sent."""
    body = b'{"model": "xing4", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "seed": ' + \
        seed.encode() + b'}'
    st, _, out = fake_bridge.post("/v1/chat/completions", body)
    assert st == 200, out
    sent = json.loads(fake["record"].read_text().splitlines()[-1])
    assert sent["sampling"]["seed"] == int(seed), sent


def test_a_seed_past_uint64_names_its_range(fake_bridge):
    body = b'{"model": "xing4", "messages": [{"role": "user", "content": "hi"}], "seed": 18446744073709551616}'
    st, _, out = fake_bridge.post("/v1/chat/completions", body)
    e = assert_openai_error(st, out, 400, "seed: 18446744073709551616 is out of range", param="seed")
    assert "18446744073709551615" in e["message"] and e["code"] == "integer_out_of_range", e


@pytest.mark.parametrize("value", [{}, {"search_context_size": "low"}])
def test_web_search_options_are_refused_by_name(fake_bridge, value):
    """Web search runs on OpenAI's servers: refused like a web_search tool, not silently ignored
    (even {} turns it on)."""
    st, _, out = fake_bridge.post("/v1/chat/completions", chat(web_search_options=value))
    e = assert_openai_error(st, out, 400, "web_search_options: web search", param="web_search_options")
    assert e["code"] == "unsupported_parameter", e
    st, _, out = fake_bridge.post("/v1/chat/completions", chat(web_search_options=None))
    assert st == 200, out


def test_a_big_seed_inside_something_else_stays_out_of_range(fake_bridge):
    body = b'{"model": "xing4", "messages": [{"role": "user", "content": "hi"}], "metadata": {"seed": ' \
        b'18446744073709551615}}'
    st, _, out = fake_bridge.post("/v1/chat/completions", body)
    assert_openai_error(st, out, 400, "the integer at line 1, column")


@pytest.mark.parametrize("field,value,message", [
    ("top_p", 1.5, "top_p: 1.5 is out of range (0, 1]"),
    ("temperature", -1, "temperature: -1 is out of range [0, 2]"),
    ("presence_penalty", 3, "presence_penalty: 3 is out of range [-2, 2]"),
    ("max_tokens", 0, "max_tokens: 0 is out of range"),
    ("max_completion_tokens", "ten", "max_completion_tokens: an integer expected, got a string"),
    ("top_k", 1.5, "top_k: an integer expected, got a number"),
    ("stop", ["a", "b", "c", "d", "e"], "stop: at most 4 stop strings, got 5"),
    ("seed", "x", "seed: an integer expected"),
    ("user", 5, "user: a string expected"),
    ("ignore_eos", 1, "ignore_eos: true or false expected, got an integer"),
])
def test_bad_parameter_names_the_field(bridge, field, value, message):
    st, _, body = bridge.post("/v1/chat/completions", chat(**{field: value}))
    assert_openai_error(st, body, 400, message, param=field)


def test_n_above_one_is_refused_clearly(bridge):
    st, _, body = bridge.post("/v1/chat/completions", chat(n=3))
    e = assert_openai_error(st, body, 400, "only 1 choice per request is supported, got 3", param="n")
    assert e["code"] == "unsupported_value"


@pytest.mark.parametrize("kw,param,part", [
    ({"logit_bias": {"15": 100}}, "logit_bias", "biasing token logits is not supported"),
    ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions", "send \"tools\""),
    ({"function_call": {"name": "f"}}, "function_call", "deprecated function-calling form"),
])
def test_parameters_that_would_change_the_answer_are_not_ignored(bridge, kw, param, part):
    # silently dropping these answered a different request than the one sent
    st, _, body = bridge.post("/v1/chat/completions", chat(**kw))
    e = assert_openai_error(st, body, 400, part, param=param)
    assert e["code"] == "unsupported_parameter"
    if param == "logit_bias":
        st, _, body = bridge.post("/v1/completions", {"model": "xing4", "prompt": "a", "max_tokens": 2, **kw})
        assert_openai_error(st, body, 400, part, param=param)
    # what clients send by default still works: an empty bias map, nulls
    for ok in ({"logit_bias": {}}, {"logit_bias": None, "functions": None, "function_call": None},
               {"functions": [], "function_call": "none"}, {"function_call": "auto"}):
        st, _, body = bridge.post("/v1/chat/completions", chat(max_tokens=2, **ok))
        assert st == 200, body


def test_image_content_part_is_refused(bridge):
    msg = {"role": "user", "content": [{"type": "text", "text": "what is this"},
                                       {"type": "image_url", "image_url": {"url": "data:,"}}]}
    st, _, body = bridge.post("/v1/chat/completions", {"model": "xing4", "messages": [msg]})
    assert_openai_error(st, body, 400, 'content part type "image_url" is not supported',
                        param="messages[0].content[1]")


def test_unknown_role_and_missing_messages(bridge):
    st, _, body = bridge.post("/v1/chat/completions",
                              {"model": "xing4", "messages": [{"role": "wizard", "content": "x"}]})
    assert_openai_error(st, body, 400, '"wizard" is not a role', param="messages[0].role")
    st, _, body = bridge.post("/v1/chat/completions", {"model": "xing4"})
    assert_openai_error(st, body, 400, "messages: required", param="messages")


def test_completions_prompt_checks(bridge):
    st, _, body = bridge.post("/v1/completions", {"model": "xing4"})
    assert_openai_error(st, body, 400, "prompt: required", param="prompt")
    st, _, body = bridge.post("/v1/completions", {"model": "xing4", "prompt": "x", "echo": True})
    assert_openai_error(st, body, 400, "echoing the prompt", param="echo")


def test_prompt_over_the_context_is_400_context_length_exceeded(bridge):
    # 64 pages x 256 tokens = 16384: ~40000 words cannot fit
    st, _, body = bridge.post("/v1/completions",
                              {"model": "xing4", "prompt": "word " * 40000, "max_tokens": 4})
    e = assert_openai_error(st, body, 400, "")
    assert e["code"] == "context_length_exceeded", e
    assert "context" in e["message"] or "16384" in e["message"], e["message"]


def test_daemon_refusals_name_the_request_field(demo_model, make_bridge, tmp_path):
    # the daemon refuses with its protocol's field first ("prompt of N tokens ...",
    # "prompt.chat.messages: ..."): param is that field in the endpoint's own names
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", demo_model, conf="[xing4d]\ncache-pages = 4\npage_tokens = 16\nmax-messages = 2\n")
    try:
        b = make_bridge([d.sock])
        long = "word " * 80  # over the 64-token context
        for path, body, param in (
                ("/v1/chat/completions", chat(long), "messages"),
                ("/v1/completions", {"model": "xing4", "prompt": long}, "prompt"),
                ("/v1/responses", {"model": "xing4", "input": long}, "input")):
            st, _, out = b.post(path, body)
            e = assert_openai_error(st, out, 400, "leaves no room for output in the context limit of 64 tokens",
                                    param=param)
            assert e["code"] == "context_length_exceeded", e
        three = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                 {"role": "user", "content": "c"}]
        st, _, out = b.post("/v1/chat/completions", {"model": "xing4", "messages": three, "max_tokens": 1})
        assert_openai_error(st, out, 400, "prompt.chat.messages: 3 messages, at most 2 accepted", param="messages")
    finally:
        d.close()


# ---- 401 / 404 / 405 ---------------------------------------------------------------------------

def test_api_key_is_required_when_configured(daemon, make_bridge, tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    b = make_bridge([daemon.sock], "--api-key-file", str(key))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"}):
        st, hdrs, body = b.post("/v1/chat/completions", chat(max_tokens=2), headers=headers)
        e = assert_openai_error(st, body, 401, "missing or wrong API key")
        assert e["code"] == "invalid_api_key" and hdrs.get("www-authenticate") == "Bearer"
    st, _, body = b.post("/v1/chat/completions", chat(max_tokens=2),
                         headers={"Authorization": "Bearer s3cret-key"})
    assert st == 200, body
    # the scheme is case-insensitive and may be followed by several spaces (RFC 9110 credentials)
    for auth in ("bearer s3cret-key", "Bearer   s3cret-key"):
        st, _, body = b.post("/v1/chat/completions", chat(max_tokens=2), headers={"Authorization": auth})
        assert st == 200, (auth, body)
    # health and metrics stay open for probes and scrapers
    assert b.request("GET", "/health")[0] == 200
    assert b.request("GET", "/metrics")[0] == 200


def test_unknown_model_is_404(bridge):
    st, _, body = bridge.post("/v1/chat/completions", chat(model="gpt-4o"))
    e = assert_openai_error(st, body, 404, 'The model "gpt-4o" does not exist', param="model")
    assert e["code"] == "model_not_found" and '"xing4"' in e["message"]


def test_unknown_url_and_wrong_method(bridge):
    st, _, body = bridge.request("GET", "/v1/images/generations")
    assert_openai_error(st, body, 404, "Unknown request URL: GET /v1/images/generations")
    st, _, body = bridge.request("GET", "/v1/chat/completions")
    assert_openai_error(st, body, 405, "/v1/chat/completions: only POST")


def test_head_is_answered_on_get_endpoints(bridge):
    # uptime checks and load balancers probe with HEAD: the GET answer's status and headers, no
    # body (the next request on the same connection must read its own answer, not a stray body)
    c = bridge.conn(30)
    for path in ("/health", "/ready", "/metrics", "/v1/models", "/v1/models/xing4"):
        c.request("HEAD", path)
        r = c.getresponse()
        assert r.status == 200, (path, r.status)
        assert r.read() == b"", path
    c.request("GET", "/health")
    r = c.getresponse()
    assert r.status == 200 and json.loads(r.read())["status"] == "ok"
    c.close()
    # a 405 says which methods the path takes
    st, hdrs, body = bridge.request("POST", "/health", {})
    assert_openai_error(st, body, 405, "/health: only GET")
    assert hdrs["allow"] == "GET, HEAD"
    st, hdrs, body = bridge.request("HEAD", "/v1/chat/completions")
    assert st == 405 and hdrs["allow"] == "POST"
    st, hdrs, body = bridge.request("PUT", "/v1/nothing-here")
    assert_openai_error(st, body, 404, "Unknown request URL: PUT /v1/nothing-here")


def test_trailing_and_doubled_slashes_reach_the_endpoint(bridge):
    # a base URL configured as "http://host:8000/v1/" and joined naively gives "/v1//chat/completions";
    # "/v1/models/" is the same resource as "/v1/models"
    st, _, body = bridge.post("/v1//chat/completions", chat(max_tokens=2))
    assert st == 200 and body["object"] == "chat.completion", body
    st, _, body = bridge.post("/v1/chat/completions/", chat(max_tokens=2))
    assert st == 200, body
    st, _, body = bridge.request("GET", "/v1/models/")
    assert st == 200 and body["data"][0]["id"] == "xing4"
    st, _, body = bridge.request("GET", "/health/")
    assert st == 200 and body["status"] == "ok"
    st, _, body = bridge.request("GET", "/v1/images//generations/")
    assert_openai_error(st, body, 404, "Unknown request URL: GET /v1/images/generations")


def test_cancel_of_unknown_request_is_404(bridge):
    st, _, body = bridge.request("DELETE", "/v1/requests/chatcmpl-999999")
    assert_openai_error(st, body, 404, 'request "chatcmpl-999999" is not in flight', param="id")


# ---- 413 / 429 / 503 ---------------------------------------------------------------------------

def test_body_over_the_cap_is_413(daemon, make_bridge):
    b = make_bridge([daemon.sock], "--max-body-bytes", "2000")
    st, _, body = b.post("/v1/chat/completions", chat("x" * 3000))
    e = assert_openai_error(st, body, 413, "exceeds this server's limit of 2000 bytes")
    assert e["code"] == "request_too_large"
    st, _, body = b.post("/v1/chat/completions", chat("x" * 100, max_tokens=2))
    assert st == 200, body


def test_concurrency_cap_is_429_with_retry_after(daemon, make_bridge):
    b = make_bridge([daemon.sock], "--max-concurrent", "1")
    c = b.conn()
    c.request("POST", "/v1/chat/completions",
              body='{"model":"xing4","messages":[{"role":"user","content":"long"}],"max_tokens":4000,'
                   '"ignore_eos":true,"stream":true}',  # in flight until closed, whatever it samples
              headers={"Content-Type": "application/json"})
    r = c.getresponse()  # headers come with the first token: the request is in flight now
    assert r.status == 200
    st, hdrs, body = b.post("/v1/chat/completions", chat(max_tokens=2))
    e = assert_openai_error(st, body, 429, "1 requests are in flight")
    assert e["code"] == "rate_limit_exceeded" and hdrs["retry-after"] == "1"
    c.close()


def test_unreachable_daemon_is_503_with_retry_after(make_bridge, tmp_path):
    b = make_bridge([str(tmp_path / "nobody-here.sock")])
    st, hdrs, body = b.post("/v1/chat/completions", chat())
    e = assert_openai_error(st, body, 503, "xing4d is unreachable")
    assert "nobody-here.sock" in e["message"] and int(hdrs["retry-after"]) >= 1
    st, hdrs, body = b.request("GET", "/health")
    assert st == 503 and body["status"] == "unavailable" and "retry-after" in hdrs
    assert b.request("GET", "/ready")[0] == 503


def test_a_socket_that_is_not_xing4d_is_503_naming_it(make_bridge, tmp_path):
    # the wrong path configured: the peer answers the handshake with HTTP. The library says the
    # peer does not speak xing4d's protocol; the bridge answers as for an unreachable daemon (503,
    # retry later) with that reason, not with an internal error
    path = str(tmp_path / "web.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            try:
                c.recv(4096)
                c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            finally:
                c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        b = make_bridge([path])
        st, hdrs, body = b.post("/v1/chat/completions", chat())
        e = assert_openai_error(st, body, 503, "xing4d is unreachable")
        assert "web.sock" in e["message"] and "protocol" in e["message"], e
        assert int(hdrs["retry-after"]) >= 1
    finally:
        stop.set()
        t.join()
        srv.close()


def test_daemon_still_loading_is_503(make_bridge, tmp_path):
    # a socket that accepts into its backlog but never answers the handshake: what a client sees
    # while a socket-activated xing4d loads its model
    path = str(tmp_path / "loading.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    b = make_bridge([path], "--connect-timeout-ms", "300")
    t0 = time.monotonic()
    st, hdrs, body = b.request("GET", "/health")
    assert st == 503 and body["daemons"][0]["state"] == "unreachable", body
    assert "loading" in body["daemons"][0]["detail"] or "timeout" in body["daemons"][0]["detail"].lower()
    assert time.monotonic() - t0 < 5
    s.close()


def test_daemon_internal_error_is_500(fake_bridge):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("error-internal"))
    e = assert_openai_error(st, body, 500, "scripted internal failure")
    assert e["type"] == "server_error"


def test_daemon_invalid_argument_is_400(fake_bridge):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("error-invalid"))
    assert_openai_error(st, body, 400, "sampling.top_k: scripted refusal", param="top_k")


def test_error_after_stream_start_is_a_data_event(fake_bridge):
    c = fake_bridge.conn()
    c.request("POST", "/v1/chat/completions", body=__import__("json").dumps(chat("error-after-start", stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    events = [x for x in r.read().decode().split("\n\n") if x]
    assert events[-1].startswith("data: {\"error\":"), events
    err = __import__("json").loads(events[-1][6:])["error"]
    assert err["message"] == "scripted failure after the first token" and err["type"] == "server_error"
    assert "data: [DONE]" not in events
    c.close()


def test_header_read_timeout_closes_silent_connections(daemon, make_bridge):
    b = make_bridge([daemon.sock], "--timeout", "1")
    s = socket.create_connection(("127.0.0.1", b.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never finished
    s.settimeout(10)
    t0 = time.monotonic()
    data = s.recv(4096)  # the server hangs up (maybe after a 408/400 line)
    while data:
        data = s.recv(4096)
    assert time.monotonic() - t0 < 8
    s.close()
