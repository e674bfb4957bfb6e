# SPDX-License-Identifier: MIT
"""HTTP/1.1 message framing (RFC 9110/9112) on raw sockets: what a strict client or proxy relies on."""
import socket


def raw(b, data, wait=2.0):
    s = socket.create_connection(("127.0.0.1", b.port))
    s.sendall(data)
    s.settimeout(wait)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except socket.timeout:
        pass
    s.close()
    return out


def test_head_has_the_get_length_and_no_body(fake_bridge):
    """HEAD: the GET's headers with its Content-Length, no body; the connection stays usable."""
    c = fake_bridge.conn(timeout=5)
    c.request("GET", "/v1/models")
    r = c.getresponse()
    body = r.read()
    assert r.status == 200
    c.request("HEAD", "/v1/models")
    r = c.getresponse()
    assert r.status == 200
    assert r.getheader("Content-Length") == str(len(body))
    assert r.read() == b""
    # keep-alive: the next request on the same connection gets its own response
    c.request("GET", "/health")
    r = c.getresponse()
    assert r.status == 200 and b'"status"' in r.read()
    c.close()


def test_head_of_an_error_has_no_body(fake_bridge):
    out = raw(fake_bridge, b"HEAD /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    first, _, rest = out.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 404"), out
    assert b"Content-Length: " in first and b"Content-Length: 0" not in first, first
    assert rest.startswith(b"HTTP/1.1 200"), out


def test_garbage_request_line_is_answered_in_http_1_1(fake_bridge):
    out = raw(fake_bridge, b"GARBAGE\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 "), out[:40]


def test_disagreeing_content_lengths_are_refused(fake_bridge):
    out = raw(fake_bridge, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 2\r\nContent-Length: 5\r\n\r\n{}")
    assert out.startswith(b"HTTP/1.1 400 "), out[:200]
    assert b"Content-Length headers disagree" in out, out
    assert b"Connection: close" in out


def test_equal_content_lengths_are_fine(fake_bridge):
    out = raw(fake_bridge, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    assert out.startswith(b"HTTP/1.1 400 "), out[:200]
    assert b"model" in out  # the body's own error, not the framing's

