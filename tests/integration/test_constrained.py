# SPDX-License-Identifier: MIT
"""Constrained decoding (GenerateRequest.constraint) on the random-weight demo model: whatever the
weights say, a seeded sampled answer must parse and validate against its JSON Schema, a forced
tool call (in the model's native syntax, which the daemon's output parser turns into a call) must
name a requested tool with arguments valid against its parameters, and bad
constraints are refused naming the field. Raw frames (x4wire), so this needs no client support."""
import json
import struct
import subprocess

import pytest

import x4wire as w
from conftest import BUILD, DEFAULT_CONF, Daemon, sized

SCHEMAS = [
    {"type": "object",
     "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                    "email": {"type": ["string", "null"]}},
     "required": ["name", "age", "email"], "additionalProperties": False},
    {"type": "object",
     "properties": {"title": {"type": "string"},
                    "rating": {"type": "number"},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                    "kind": {"enum": ["book", "film", "game"]}},
     "required": ["title", "kind"], "additionalProperties": False},
    {"type": "object",
     "properties": {"ok": {"type": "boolean"}, "count": {"type": "integer"},
                    "point": {"type": "object",
                              "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                              "required": ["x", "y"], "additionalProperties": False}},
     "required": ["ok", "point"], "additionalProperties": False},
    {"anyOf": [
        {"type": "object", "properties": {"status": {"const": "done"}, "result": {"type": "string"}},
         "required": ["status", "result"], "additionalProperties": False},
        {"type": "object", "properties": {"status": {"const": "error"}, "code": {"type": "integer"}},
         "required": ["status", "code"], "additionalProperties": False}]},
    {"$defs": {"step": {"type": "object",
                        "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
                        "required": ["text", "n"], "additionalProperties": False}},
     "type": "object",
     "properties": {"steps": {"type": "array", "items": {"$ref": "#/$defs/step"}, "minItems": 1}},
     "required": ["steps"], "additionalProperties": False},
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string"},
                                      "unit": {"type": "string", "enum": ["c", "f"]},
                                      "days": {"type": "integer"}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object",
                       "properties": {"query": {"type": "string"},
                                      "limit": {"type": "integer"}},
                       "required": ["query"]}}},
]
TOOL_PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

MAX_TOKENS = 96


def validate(v, schema, root=None, path="$"):
    """A JSON Schema check for the keywords these tests use, written apart from the daemon's
    compiler (Debian's python3-jsonschema is not among the test dependencies)."""
    root = root or schema
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        return validate(v, root["$defs"][name], root, path)
    if "anyOf" in schema:
        errors = []
        for s in schema["anyOf"]:
            try:
                return validate(v, s, root, path)
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError(f"{path}: no anyOf branch matches: {errors}")
    if "const" in schema:
        assert v == schema["const"] and type(v) is type(schema["const"]), f"{path}: {v!r} != const"
    if "enum" in schema:
        assert any(v == e and type(v) is type(e) for e in schema["enum"]), f"{path}: {v!r} not in enum"
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        ok = {"object": isinstance(v, dict), "array": isinstance(v, list),
              "string": isinstance(v, str), "null": v is None,
              "boolean": isinstance(v, bool),
              "integer": isinstance(v, int) and not isinstance(v, bool),
              "number": isinstance(v, (int, float)) and not isinstance(v, bool)}
        assert any(ok[t] for t in types), f"{path}: {v!r} is not {types}"
    if isinstance(v, dict):
        props = schema.get("properties", {})
        for k in schema.get("required", []):
            assert k in v, f"{path}: required {k!r} missing"
        for k, x in v.items():
            if k in props:
                validate(x, props[k], root, f"{path}.{k}")
            else:
                assert schema.get("additionalProperties", True) is not False, f"{path}: extra {k!r}"
    if isinstance(v, list):
        assert len(v) >= schema.get("minItems", 0), f"{path}: fewer than minItems"
        assert len(v) <= schema.get("maxItems", len(v)), f"{path}: more than maxItems"
        for i, x in enumerate(v):
            validate(x, schema.get("items", {}), root, f"{path}[{i}]")


def f32(v):
    return struct.pack("<f", v)


def chat_request(content, constraint, seed, max_tokens=MAX_TOKENS, tools=None, thinking=False,
                 thinking_budget=None):
    msg = w.field_bytes(1, "user") + w.field_bytes(2, content)
    chat = w.field_bytes(1, msg)
    if tools is not None:
        chat += w.field_bytes(2, json.dumps(tools))
    chat += w.field_varint(3, 1 if thinking else 0)
    sampling = w.varint(1 << 3 | 5) + f32(1.0) + w.field_varint(5, seed)
    req = w.field_bytes(3, chat) + w.field_bytes(4, sampling) + w.field_varint(5, max_tokens)
    if thinking_budget is not None:
        req += w.field_varint(10, thinking_budget)
    return req + w.field_bytes(13, constraint)


def json_schema(schema):
    return w.field_bytes(2, json.dumps(schema) if not isinstance(schema, str) else schema)


def tool_choice(name=None):
    return w.field_bytes(3, w.field_bytes(1, name) if name else b"")


def tool_calls(name=None):
    """Constraint.tool_calls (minor 6): free output, each call the model begins held to the tools."""
    return w.field_bytes(5, w.field_bytes(1, name) if name else b"")


def run_all(conn, reqs):
    """Send every request multiplexed on one connection; return {id: result}."""
    out = {}
    for rid, payload in reqs.items():
        conn.send(w.frame(rid, w.GENERATE, payload))
        out[rid] = {"content": b"", "reasoning": b"", "calls": [], "finish": None, "error": None}
    left = set(reqs)
    while left:
        f = conn.recv()
        assert f is not None, "the daemon closed the connection"
        rid = f[1][0]
        r = out[rid]
        if w.CHUNK in f:
            c = w.parse(f[w.CHUNK][0])
            channel = c.get(3, [0])[0]
            text = c.get(1, [b""])[0]
            if channel == 1:
                r["reasoning"] += text
            elif channel == 0:
                r["content"] += text
            if 5 in c:
                tc = w.parse(c[5][0])
                r["calls"].append((tc[1][0].decode(), tc[2][0].decode()))
        elif w.DONE in f:
            r["finish"] = w.parse(f[w.DONE][0]).get(1, [0])[0]
            left.discard(rid)
        elif w.ERROR in f:
            r["error"] = w.error_of(f)
            left.discard(rid)
    return out


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    model = tmp / "demo.gguf"
    subprocess.run([str(BUILD / "tools" / "x4-mkmodel"), "--preset", "demo", "--quiet",
                    "--out", str(model)], check=True)
    conf = DEFAULT_CONF.replace("max-running = 4", "max-running = 16")
    d = Daemon(tmp / "d", conf, args=("--model", str(model)))
    conn = w.Conn(d.sock, timeout=120)
    conn.hello()
    yield conn
    conn.close()
    d.close()


def test_json_schema_answers_validate(demo):
    reqs = {}
    for i in range(50):
        schema = SCHEMAS[i % len(SCHEMAS)]
        reqs[i + 1] = chat_request(f"Describe item {i} as JSON.", json_schema(schema), seed=1000 + i)
    res = run_all(demo, reqs)
    for rid, r in res.items():
        schema = SCHEMAS[(rid - 1) % len(SCHEMAS)]
        assert r["error"] is None, (rid, r["error"])
        text = r["content"].decode()
        try:
            value = json.loads(text)
        except ValueError as e:
            pytest.fail(f"request {rid} (seed {1000 + rid - 1}): not JSON ({e}): {text!r}")
        validate(value, schema)
        assert r["finish"] == 1, (rid, r["finish"], text)  # the model ended the turn (EOS)


def test_forced_tool_calls_validate(demo):
    # 50 calls; under the sanitizer (conftest.sized) the first 6 of them, 2 for each of the three
    # choices (any tool, get_weather, search), still all in flight at once: the 50 took 3 minutes
    # under ASan (12 took 172 s on a 2-core VM), and 6 take the same grammar, masking and tool-call
    # parsing code
    # The call is in the model's own syntax: get_weather's shortest is 120 bytes of markup and
    # values, and this vocabulary has no pieces for the markup, so closing in time (a byte a token
    # at worst) needs more than MAX_TOKENS
    reqs = {}
    for i in range(sized(50, 6)):
        name = [None, "get_weather", "search"][i % 3]
        reqs[100 + i] = chat_request(f"Task {i}: use a tool.", tool_choice(name), seed=2000 + i,
                                     tools=TOOLS, max_tokens=2 * MAX_TOKENS)
    res = run_all(demo, reqs)
    for rid, r in res.items():
        want = [None, "get_weather", "search"][(rid - 100) % 3]
        assert r["error"] is None, (rid, r["error"])
        assert len(r["calls"]) == 1, (rid, r)
        name, args = r["calls"][0]
        if want:
            assert name == want
        validate(json.loads(args), TOOL_PARAMS[name])
        assert r["finish"] == 4, (rid, r["finish"])  # FINISH_TOOL_CALLS
        assert r["content"] == b"", (rid, r["content"])


def test_json_object_and_thinking(demo):
    """json_object mode gives an object; with thinking on, the reasoning runs unconstrained and
    the answer after it is still valid (the reasoning is cut to leave the answer room)."""
    reqs = {}
    for i in range(6):
        reqs[300 + i] = chat_request("Any JSON object.", w.field_varint(1, 1), seed=3000 + i,
                                     thinking=i % 2 == 1, max_tokens=128)
    res = run_all(demo, reqs)
    for rid, r in res.items():
        assert r["error"] is None, (rid, r["error"])
        value = json.loads(r["content"].decode())
        assert isinstance(value, dict)
        if (rid - 300) % 2 == 1:
            assert r["reasoning"], "thinking on: some reasoning expected before the answer"


def test_a_required_answer_is_not_skipped_by_ending_the_turn_in_the_reasoning(demo):
    """A constrained answer (here json_object) after thinking: the turn may not end inside the
    reasoning (turn-ending tokens are masked until it ends), so every request answers. The demo
    model ended its turn while thinking in about a third of such requests before the mask (8 of
    24 at 256 tokens, 4 at 128). Under the sanitizers (conftest.sized) the first 8: the 16 took 48 s
    under ASan."""
    reqs = {500 + i: chat_request("Any JSON object.", w.field_varint(1, 1), seed=5000 + i, thinking=True,
                                  max_tokens=256) for i in range(sized(16, 8))}
    res = run_all(demo, reqs)
    for rid, r in res.items():
        assert r["error"] is None, (rid, r["error"])
        assert isinstance(json.loads(r["content"].decode()), dict), (rid, r["reasoning"][-40:], r["content"])


def test_forced_tool_call_after_reasoning(demo):
    """Thinking on: the reasoning is free, then the call comes, valid, before max_tokens."""
    reqs = {400 + i: chat_request("Think, then call.", tool_choice("get_weather"), seed=4000 + i,
                                  tools=TOOLS, thinking=True, max_tokens=120) for i in range(2)}
    res = run_all(demo, reqs)
    for rid, r in res.items():
        assert r["error"] is None, (rid, r["error"])
        assert r["reasoning"], "thinking on: some reasoning expected before the call"
        assert len(r["calls"]) == 1 and r["calls"][0][0] == "get_weather", (rid, r)
        validate(json.loads(r["calls"][0][1]), TOOL_PARAMS["get_weather"])
        assert r["finish"] == 4, (rid, r["finish"])


def deep_schema(levels):
    s = {"type": "string"}
    for _ in range(levels):  # two JSON levels each: the schema, its properties
        s = {"type": "object", "properties": {"a": s}}
    return s


DEEP = deep_schema(130)


@pytest.mark.parametrize("constraint,prompt_tools,want", [
    (json_schema({"type": "string", "minLength": 2}), None,
     "constraint.json_schema: keyword 'minLength' is not supported"),
    (json_schema({"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}}), None,
     "constraint.json_schema: properties.n: keyword 'maximum' is supported only on an integer and only as loose as"),
    (json_schema({"type": "object", "properties": {"to": {"type": "string", "format": "email"}}}), None,
     "constraint.json_schema: properties.to: keyword 'format' (\"email\") is not enforced"),
    (json_schema("{\"type\": "), None, "constraint.json_schema: not valid JSON"),
    # valid JSON, deeper than the daemon's parser goes: said as such, not "not valid JSON"
    (json_schema(json.dumps(DEEP)), None,
     "constraint.json_schema: too deeply nested for the daemon: its arrays and objects nest more "
     "than 256 levels deep (line 1 column "),
    (json_schema({"type": "strng"}), None, "constraint.json_schema: type 'strng' is not one of"),
    (tool_choice("nope"), TOOLS,
     "constraint.tool: tool 'nope' is not among the request's tools (get_weather, search)"),
    (tool_choice(), None, "constraint.tool: the request has no tools"),
    (tool_calls(), None, "constraint.tool_calls: the request has no tools"),
    (json_schema(SCHEMAS[0]) + w.field_varint(6, 1), None, "constraint.or_tool_calls: the request has no tools"),
    (tool_choice() + w.field_varint(6, 1), TOOLS, "constraint.or_tool_calls: an alternative to a JSON answer"),
    (tool_calls() + w.field_varint(4, 1), [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "format": "email"}}}}}],
     "constraint.tool_calls: tools[0].parameters (strict).properties.a: keyword 'format' (\"email\") is not enforced"),
    (b"", None, "constraint: none of json_object, json_schema, tool, tool_calls is set"),
])
def test_bad_constraints_are_refused(demo, constraint, prompt_tools, want):
    demo.send(w.frame(900, w.GENERATE, chat_request("x", constraint, seed=1, tools=prompt_tools)))
    f = demo.recv()
    code, msg = w.error_of(f)
    assert code == "INVALID_ARGUMENT"
    assert want in msg, msg
    # the daemon keeps serving
    res = run_all(demo, {901: chat_request("ok", w.field_varint(1, 1), seed=5)})
    assert res[901]["error"] is None


def test_lazy_tool_calls_are_free_text_or_valid_calls(demo):
    """Constraint.tool_calls: nothing is reserved (the answer may be text, thinking is not cut),
    and whatever calls come are valid against their tool's parameters."""
    reqs = {600 + i: chat_request("Call a tool or answer.", tool_calls(), seed=6000 + i, tools=TOOLS,
                                  thinking=i % 2 == 1, max_tokens=160) for i in range(4)}
    res = run_all(demo, reqs)
    for rid, r in res.items():
        assert r["error"] is None, (rid, r["error"])
        for name, args in r["calls"]:
            validate(json.loads(args), TOOL_PARAMS[name])


def test_lazy_tool_calls_over_tools_the_mask_cannot_hold(demo):
    """tool_choice auto whose tools the grammar cannot compile (here a name the native syntax
    cannot write): the request runs with its calls unconstrained, as before lazy calls existed,
    unless a tool is marked strict, which asks for exactness and is refused naming the tool."""
    odd = {"type": "function", "function": {"name": "look<up", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}
    res = run_all(demo, {680: chat_request("Look it up.", tool_calls(), seed=680, tools=[odd], max_tokens=24)})
    assert res[680]["error"] is None, res[680]["error"]
    strict = {"type": "function", "function": dict(odd["function"], strict=True)}
    demo.send(w.frame(681, w.GENERATE, chat_request("Look it up.", tool_calls(), seed=681, tools=[strict])))
    code, msg = w.error_of(demo.recv())
    assert code == "INVALID_ARGUMENT" and "the name 'look<up' cannot be written" in msg, msg


def test_json_or_tool_calls(demo):
    """Constraint.or_tool_calls beside json_schema: the answer is the JSON, valid, or calls,
    valid; never free text."""
    schema = SCHEMAS[0]
    reqs = {650 + i: chat_request("JSON or a call.", json_schema(schema) + w.field_varint(6, 1), seed=6500 + i,
                                  tools=TOOLS, thinking=i % 2 == 1, max_tokens=160) for i in range(4)}
    res = run_all(demo, reqs)
    for rid, r in res.items():
        assert r["error"] is None, (rid, r["error"])
        if r["calls"]:
            for name, args in r["calls"]:
                validate(json.loads(args), TOOL_PARAMS[name])
        else:
            validate(json.loads(r["content"]), schema)


def test_logprobs_are_of_the_masked_distribution(demo):
    """logprobs come from the masked distribution: the first token of a forced call is the only
    allowed one (logprob 0, no alternatives), and no alternative is ever -inf."""
    req = chat_request("call", tool_choice("search"), seed=7, tools=TOOLS) + w.field_varint(9, 3)
    demo.send(w.frame(950, w.GENERATE, req))
    tops = []
    while True:
        f = demo.recv()
        if w.DONE in f:
            break
        assert w.CHUNK in f, f
        c = w.parse(f[w.CHUNK][0])
        for lp in c.get(4, []):
            lp = w.parse(lp)
            chosen = struct.unpack("<f", lp[2][0])[0]
            alts = [struct.unpack("<f", w.parse(t)[2][0])[0] for t in lp.get(3, [])]
            tops.append((chosen, alts))
    assert tops, "logprobs asked for, none came"
    assert tops[0][0] == 0.0 and len(tops[0][1]) == 1, tops[0]
    for chosen, alts in tops:
        assert chosen <= 0.0 and all(a > float("-inf") for a in alts), (chosen, alts)


def test_lenient_constraints_keep_the_structure(demo):
    """Constraint.lenient (protocol 1.4): keywords the mask cannot enforce are ignored instead of
    refused, so a schema written for validation (MCP, Pydantic) still gets answers of its shape;
    the same schema without the flag is refused, as above."""
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 2, "pattern": "^[A-Z]", "format": "hostname"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "kind": {"oneOf": [{"const": "cat"}, {"const": "dog"}]}},
        "required": ["name", "age", "kind"], "additionalProperties": False}
    lenient = w.field_varint(4, 1)
    tools = [{"type": "function", "function": {"name": "read", "parameters": {
        "type": "object", "properties": {"path": {"type": "string", "pattern": "^/"}}, "required": ["path"]}}}]
    reqs = {700 + i: chat_request("Describe a pet.", json_schema(schema) + lenient, seed=7000 + i) for i in range(2)}
    reqs[710] = chat_request("Read a file.", tool_choice("read") + lenient, seed=7100, tools=tools)
    reqs[720] = chat_request("Describe a pet.", json_schema(schema), seed=7200)
    res = run_all(demo, reqs)
    for rid in (700, 701):
        r = res[rid]
        assert r["error"] is None, (rid, r["error"])
        v = json.loads(r["content"])
        assert set(v) == {"name", "age", "kind"} and isinstance(v["age"], int) and v["kind"] in ("cat", "dog"), v
    assert res[710]["error"] is None and res[710]["calls"][0][0] == "read", res[710]
    assert isinstance(json.loads(res[710]["calls"][0][1])["path"], str)
    assert "keyword 'minLength' is not supported" in res[720]["error"][1], res[720]
