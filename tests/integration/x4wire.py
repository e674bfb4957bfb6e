# SPDX-License-Identifier: MIT
"""Just enough protobuf wire format to speak proto/xing4.proto from tests without generated code,
so tests can send frames a real client library would never produce (bad versions, garbage,
oversized headers) and read the daemon's Error replies. The tests' one codec: the bridge tests'
scripted daemon (tests/bridge/fakedaemon.py) imports it too."""
import socket
import struct

# Frame body field numbers (proto/xing4.proto)
HELLO, HELLO_REPLY, GENERATE, CHUNK, DONE, CANCEL = 10, 11, 12, 13, 14, 15
SNAPSHOT, SNAPSHOT_REPLY = 16, 17
STATS, STATS_REPLY, INFO, INFO_REPLY, HEALTH, HEALTH_REPLY, ERROR = 18, 19, 20, 21, 22, 23, 24
PROGRESS = 25  # PrefillProgress (server -> client during a long prefill)
PAUSE = 26  # Pause (client -> server: one request's back-pressure; minor 6)

ERROR_NAMES = {1: "INVALID_ARGUMENT", 2: "NOT_FOUND", 3: "UNAVAILABLE", 4: "TOO_LARGE",
               5: "PROTOCOL", 6: "VERSION_MISMATCH", 7: "INTERNAL", 8: "RESOURCE_EXHAUSTED",
               9: "UNIMPLEMENTED", 10: "ALREADY_EXISTS"}


def varint(v):
    out = bytearray()
    v &= (1 << 64) - 1  # a negative int64 is ten bytes, as protobuf writes it
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def field_bytes(num, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(num << 3 | 2) + varint(len(data)) + data


def frame(request_id, body_field, body=b""):
    return field_varint(1, request_id) + field_bytes(body_field, body)


def hello(major=1, minor=0, client="pytest"):
    return field_varint(1, major) + field_varint(2, minor) + field_bytes(3, client)


def generate_tokens(ids, max_tokens=None, temperature=None, ignore_eos=False):
    packed = b"".join(varint(i) for i in ids)
    msg = field_bytes(2, field_bytes(1, packed))
    if temperature is not None:
        msg += field_bytes(4, varint(1 << 3 | 5) + struct.pack("<f", temperature))
    if max_tokens is not None:
        msg += field_varint(5, max_tokens)
    if ignore_eos:
        msg += field_varint(11, 1)
    return msg


def packed_varints(data):
    out, i = [], 0
    while i < len(data):
        v, i = _read_varint(data, i)
        out.append(v)
    return out


def parse(data):
    """Decode one message into {field: [values]} (varints as int, length-delimited as bytes,
    fixed32 as bytes)."""
    out = {}
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(data, i)
        elif wt == 2:
            n, i = _read_varint(data, i)
            v = data[i:i + n]
            i += n
        elif wt == 5:
            v = data[i:i + 4]
            i += 4
        elif wt == 1:
            v = data[i:i + 8]
            i += 8
        else:
            raise ValueError(f"wire type {wt}")
        out.setdefault(num, []).append(v)
    return out


def _read_varint(data, i):
    v = shift = 0
    while True:
        b = data[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


class Conn:
    """A raw connection: send bytes/frames, read frames (length-prefixed) with a timeout."""

    def __init__(self, path, timeout=20.0):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.buf = b""

    def close(self):
        self.s.close()

    def send_raw(self, data):
        self.s.sendall(data)

    def send(self, payload):
        self.s.sendall(struct.pack(">I", len(payload)) + payload)

    def send_frames(self, frames):
        """Several frames in one write, so that the daemon queues their requests together."""
        self.s.sendall(b"".join(struct.pack(">I", len(f)) + f for f in frames))

    def recv_generation(self, got, done):
        """The next frame of one of several generations on this connection: a Chunk's token ids
        go onto got[request id], a Done (parsed) into done[request id]. A closed connection or an
        Error frame fails. Returns the request id."""
        f = self.recv()
        assert f is not None and ERROR not in f, f
        rid = f[1][0]
        if CHUNK in f:
            got[rid] += packed_varints(parse(f[CHUNK][0]).get(2, [b""])[0])
        elif DONE in f:
            done[rid] = parse(f[DONE][0])
        return rid

    def generate_all(self, bodies):
        """Send the Generate bodies as requests 1..n in one write and read until all are done:
        ({request id: token ids}, {request id: Done fields})."""
        bodies = list(bodies)
        self.send_frames(frame(k + 1, GENERATE, b) for k, b in enumerate(bodies))
        got, done = {k + 1: [] for k in range(len(bodies))}, {}
        while len(done) < len(bodies):
            self.recv_generation(got, done)
        return got, done

    def hello(self):
        self.send(frame(0, HELLO, hello()))
        f = self.recv()
        assert HELLO_REPLY in f, f
        return f

    def _fill(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(65536)
            if not chunk:
                return False
            self.buf += chunk
        return True

    def recv(self):
        """The next frame as {field: [values]}, or None when the server closed."""
        if not self._fill(4):
            return None
        n = struct.unpack(">I", self.buf[:4])[0]
        if not self._fill(4 + n):
            return None
        payload, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
        return parse(payload)

    def closed_by_server(self):
        return self.recv() is None


def error_of(f):
    """(code name, message) of an Error frame."""
    assert ERROR in f, f"expected an Error frame, got fields {sorted(f)}"
    e = parse(f[ERROR][0])
    return ERROR_NAMES.get(e.get(1, [0])[0], "?"), e.get(2, [b""])[0].decode()
