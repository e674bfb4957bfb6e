# SPDX-License-Identifier: MIT
"""Byte-exact SSE fixtures: a stream the bridge sent for a scripted fake-daemon reply is compared
with tests/bridge/fixtures/NAME.sse byte for byte, after only the random parts are named: the
response id's 32 hex digits (and the 24 that item and call ids take from it) become <ID>, and
created/created_at timestamps 0. X4_UPDATE_FIXTURES=1 rewrites the files instead (review the
diff before committing one)."""
import json
import os
import re
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def normalize(data: bytes) -> bytes:
    data = re.sub(rb"(msg_|resp_|chatcmpl-|cmpl-)[0-9a-f]{32}", rb"\1<ID>", data)
    data = re.sub(rb"(toolu_|call_|fc_|rs_|msg_)[0-9a-f]{24}_", rb"\1<ID>_", data)
    data = re.sub(rb'"(created|created_at)":\d+', rb'"\1":0', data)
    return data


def check(name: str, data: bytes):
    path = FIXTURES / f"{name}.sse"
    got = normalize(data)
    if os.environ.get("X4_UPDATE_FIXTURES") == "1":
        FIXTURES.mkdir(exist_ok=True)
        path.write_bytes(got)
        return
    want = path.read_bytes()
    assert got == want, f"{path.name} differs:\n--- want\n{want.decode()}\n--- got\n{got.decode()}"


def stream(bridge, path: str, body) -> bytes:
    """POSTs body (a streaming request) to path on the bridge; the stream's bytes, after checking
    that it answered 200 with an event stream."""
    c = bridge.conn()
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    assert r.status == 200, data
    assert r.getheader("Content-Type") == "text/event-stream; charset=utf-8"
    return data
