# SPDX-License-Identifier: MIT
"""What a web page or a careless client could do to the bridge: cross-origin requests (only the
configured origins, preflight answered), bodies that do not say they are JSON (415), bodies
past every limit (413 in JSON, also the ones libevent refuses before the bridge sees them), and
the small API gaps: \\u0000 in strings, tool-call id length, /v1/models/{id}, /v1/embeddings."""
import json
import socket

from conftest import assert_openai_error, chat


def test_text_plain_post_is_415(fake_bridge):
    for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        st, _, body = fake_bridge.post("/v1/chat/completions", chat("hi"), headers={"Content-Type": ct})
        e = assert_openai_error(st, body, 415, "Content-Type \"%s\" is not accepted" % ct)
        assert e["code"] == "unsupported_media_type"


def test_missing_content_type_is_415(fake_bridge):
    c = fake_bridge.conn()
    c.putrequest("POST", "/v1/chat/completions")
    data = json.dumps(chat("hi")).encode()
    c.putheader("Content-Length", str(len(data)))
    c.endheaders(data)
    r = c.getresponse()
    body = json.loads(r.read())
    assert_openai_error(r.status, body, 415, "Content-Type missing is not accepted")


def test_json_with_charset_is_accepted(fake_bridge):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("hi"),
                                   headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert st == 200, body


def test_foreign_origin_is_refused_and_nothing_generated(fake, fake_bridge):
    before = len(fake["record"].read_text().splitlines()) if fake["record"].exists() else 0
    st, hdrs, body = fake_bridge.post("/v1/chat/completions", chat("hi"), headers={"Origin": "https://evil.example"})
    e = assert_openai_error(st, body, 403, "Origin \"https://evil.example\" refused")
    assert "cors-origin" in e["message"]
    assert "access-control-allow-origin" not in hdrs
    after = len(fake["record"].read_text().splitlines()) if fake["record"].exists() else 0
    assert after == before
    # its preflight is refused too, so a browser never sends the POST
    st, hdrs, _ = fake_bridge.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert st == 403 and "access-control-allow-origin" not in hdrs


def test_allowed_origin_gets_cors_headers_and_preflight(fake, make_bridge):
    b = make_bridge([fake["socket"]], "--cors-origin", "http://localhost:3000")
    st, hdrs, _ = b.request("OPTIONS", "/v1/messages", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, x-api-key, anthropic-version"})
    assert st == 204
    assert hdrs["access-control-allow-origin"] == "http://localhost:3000"
    assert "POST" in hdrs["access-control-allow-methods"]
    assert hdrs["access-control-allow-headers"] == "content-type, x-api-key, anthropic-version"
    st, hdrs, body = b.post("/v1/chat/completions", chat("hi"), headers={"Origin": "http://localhost:3000"})
    assert st == 200, body
    assert hdrs["access-control-allow-origin"] == "http://localhost:3000" and hdrs["vary"] == "Origin"
    st, _, _ = b.post("/v1/chat/completions", chat("hi"), headers={"Origin": "http://localhost:3001"})
    assert st == 403


def test_cors_origin_setting_is_checked(fake, tmp_path):
    import subprocess
    from conftest import HTTP
    for bad in ("localhost:3000", "https://a.example/path"):
        r = subprocess.run([str(HTTP), "--config", "/dev/null", "--listen", "127.0.0.1:0", "--socket",
                            fake["socket"], "--cors-origin", bad], capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and f'cors-origin "{bad}"' in r.stderr, r.stderr


def raw_exchange(port, head, body=b""):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(head + body)
    data = b""
    while True:
        try:
            d = s.recv(65536)
        except ConnectionResetError:
            break
        if not d:
            break
        data += d
    s.close()
    return data


def test_body_past_the_hard_cap_is_json_413(fake, make_bridge):
    # 20 MB announced: libevent refuses it before reading it, and still answers JSON
    b = make_bridge([fake["socket"]])
    head = (b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 20000000\r\n\r\n")
    data = raw_exchange(b.port, head, b"{")
    status_line, _, rest = data.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413"), data[:200]
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in headers.lower()
    j = json.loads(body)
    assert j["type"] == "error" and j["error"]["type"] == "request_too_large"
    assert "limit of 4194304 bytes" in j["error"]["message"] and j["error"]["code"] == "request_too_large"


def test_malformed_request_is_json_400(fake_bridge):
    data = raw_exchange(fake_bridge.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nBad header line\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400"), data[:200]
    j = json.loads(data.partition(b"\r\n\r\n")[2])
    assert "malformed HTTP request" in j["error"]["message"]


def test_nul_in_strings_is_accepted(fake, fake_bridge):
    body = '{"model":"xing4","max_tokens":4,"messages":[{"role":"user","content":"a\\u0000b"}]}'
    st, _, out = fake_bridge.post("/v1/chat/completions", body)
    assert st == 200, out
    rec = json.loads(fake["record"].read_text().splitlines()[-1])
    assert rec["messages"][-1]["content"] == "a\ufffdb"
    st, _, out = fake_bridge.post("/v1/completions", '{"model":"xing4","max_tokens":4,"prompt":"x\\u0000"}')
    assert st == 200, out
    assert json.loads(fake["record"].read_text().splitlines()[-1])["text"] == "x\ufffd"


def test_tool_call_ids_fit_openai_limit(fake_bridge):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("weather?", tools=tools))
    assert st == 200, body
    cid = body["choices"][0]["message"]["tool_calls"][0]["id"]
    assert cid.startswith("call_") and len(cid) <= 40, cid
    r = fake_bridge.conn()
    r.request("POST", "/v1/chat/completions", body=json.dumps(chat("weather?", tools=tools, stream=True)),
              headers={"Content-Type": "application/json"})
    data = r.getresponse().read().decode()
    ids = [tc["id"] for line in data.split("\n\n") if line.startswith("data: {")
           for tc in json.loads(line[6:])["choices"][0]["delta"].get("tool_calls", []) if "id" in tc]
    assert ids and all(len(i) <= 40 for i in ids), ids


def test_models_retrieve(fake_bridge):
    st, _, body = fake_bridge.request("GET", "/v1/models/xing4")
    assert st == 200 and body["id"] == "xing4" and body["object"] == "model"
    st, _, body = fake_bridge.request("GET", "/v1/models/claude-sonnet-4-5")  # the default alias table
    assert st == 200 and body["id"] == "claude-sonnet-4-5"
    st, _, body = fake_bridge.request("GET", "/v1/models/gpt-4o")
    assert_openai_error(st, body, 404, 'The model "gpt-4o" does not exist', param="model")


def test_models_list_reads_in_both_apis(fake_bridge):
    # the list's entries were OpenAI-only while retrieve also had Anthropic's fields: an Anthropic
    # client listing models got no display_name/created_at, and no page fields to stop on
    import re
    st, _, body = fake_bridge.request("GET", "/v1/models", headers={"anthropic-version": "2023-06-01"})
    assert st == 200 and body["object"] == "list"
    assert body["has_more"] is False and body["first_id"] == body["last_id"] == "xing4"
    (m,) = body["data"]
    assert {m[k] for k in ("id", "display_name")} == {"xing4"} and m["object"] == m["type"] == "model"
    assert isinstance(m["created"], int) and m["owned_by"] == "xing4d"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m["created_at"]), m["created_at"]
    st, _, one = fake_bridge.request("GET", "/v1/models/xing4")
    assert st == 200 and {k: one[k] for k in ("id", "object", "type", "display_name", "created", "created_at")} == \
        {k: m[k] for k in ("id", "object", "type", "display_name", "created", "created_at")}


def test_embeddings_say_why_not(fake_bridge):
    st, _, body = fake_bridge.post("/v1/embeddings", {"model": "xing4", "input": "hi"})
    e = assert_openai_error(st, body, 400, "no embedding output", param="model")
    assert e["code"] == "embeddings_unsupported"


def test_model_alias_setting(fake, make_bridge):
    b = make_bridge([fake["socket"]], "--model-alias", "none")
    st, _, body = b.post("/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 4,
                                          "messages": [{"role": "user", "content": "hi"}]})
    assert st == 404 and body["error"]["type"] == "not_found_error", body
    b = make_bridge([fake["socket"]], "--model-alias", "gpt-*")
    st, _, body = b.post("/v1/chat/completions", chat("hi", model="gpt-4o"))
    assert st == 200 and body["model"] == "xing4", body


def test_parse_error_quoting_bad_utf8_is_still_json(fake_bridge):
    # jansson's message quotes the bytes near the fault; the error must still encode
    st, _, body = fake_bridge.post("/v1/chat/completions", b'{"model": "xing4", "messages": "a\\u000\xd0\x9d\xdd\x7f]')
    e = assert_openai_error(st, body, 400, "not valid JSON")
    assert e["code"] == "invalid_json"
