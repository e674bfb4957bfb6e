# SPDX-License-Identifier: MIT
"""Chat completions' response_format and tool_choice become the protocol request's Constraint
(GenerateRequest.constraint), checked in what the scripted fake daemon receives; bad values are
answered 400 naming the field. Whether the engine honours the constraint is the engine's part
(its grammar tests, and tests/compat against a real daemon)."""
import json

import pytest

from conftest import assert_openai_error, chat

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
          "additionalProperties": False}


def last_request(fake):
    return json.loads(fake["record"].read_text().splitlines()[-1])


@pytest.mark.parametrize("kw,want", [
    ({"response_format": {"type": "json_object"}}, {"json_object": True}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA,
                                                                 "strict": True}}}, {"json_schema": SCHEMA}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "any"}}}, {"json_object": True}),
    ({"response_format": {"type": "text"}}, None),
    ({"tools": TOOLS, "tool_choice": "required"}, {"tool": None}),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, {"tool": "get_time"}),
    # auto (the default with tools): free, each call the model begins held to the tools' syntax
    ({"tools": TOOLS, "tool_choice": "auto"}, {"tool_calls": None}),
    ({"tools": TOOLS}, {"tool_calls": None}),
    ({"tools": TOOLS, "tool_choice": "none"}, None),
])
def test_constraint_reaches_the_daemon(fake, fake_bridge, kw, want):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("q", **kw))
    assert st == 200, body
    assert last_request(fake).get("constraint") == want


def test_auto_tools_are_lenient_and_carry_strict(fake, fake_bridge):
    """tool_choice auto: constraint.tool_calls, lenient (keywords the mask cannot enforce are
    ignored), and the tools go as given, so a tool's "strict": true reaches the daemon, which holds
    that tool's arguments to its schema exactly (grammar.h)."""
    strict = [{"type": "function", "function": {
        "name": "get_weather", "strict": True, "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "tz": {"enum": ["utc", "local"]}},
            "required": ["city", "tz"], "additionalProperties": False}}}]
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("q", tools=strict, tool_choice="auto"))
    assert st == 200, body
    r = last_request(fake)
    assert r["constraint"] == {"tool_calls": None} and r["constraint_lenient"] is True, r
    assert r["tools"][0]["function"]["strict"] is True, r["tools"]
    # Responses: "strict": true said outright is carried (flattened function tools)
    st, _, body = fake_bridge.post("/v1/responses", {"model": "xing4", "input": "q", "tools": [
        {"type": "function", "name": "f", "strict": True, "parameters": {"type": "object"}}]})
    assert st == 200, body
    r = last_request(fake)
    assert r["constraint"] == {"tool_calls": None}, r
    assert r["tools"][0]["function"]["strict"] is True, r["tools"]


@pytest.mark.parametrize("path,body,want", [
    ("/v1/chat/completions", chat("q", tools=TOOLS, response_format={"type": "json_object"}), {"json_object": True}),
    ("/v1/chat/completions", chat("q", tools=TOOLS, tool_choice="auto", response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}), {"json_schema": SCHEMA}),
    ("/v1/responses", {"model": "xing4", "input": "q", "tools": [{"type": "function", "name": "f"}],
                       "text": {"format": {"type": "json_object"}}}, {"json_object": True}),
    ("/v1/messages", {"model": "xing4", "max_tokens": 64, "messages": [{"role": "user", "content": "q"}],
                      "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                      "output_format": {"type": "json_schema", "schema": SCHEMA}}, {"json_schema": SCHEMA}),
])
def test_tools_under_auto_with_a_json_answer_are_either(fake, fake_bridge, path, body, want):
    """tools under tool_choice auto and a JSON answer: the answer is that JSON or tool calls,
    chosen at its first token (Constraint.or_tool_calls beside the format's own constraint),
    never tools silently dropped; the format's strictness is kept (strict: no lenient)."""
    st, _, resp = fake_bridge.post(path, body)
    assert st == 200, resp
    r = last_request(fake)
    assert r["constraint"] == want and r.get("constraint_or_tool_calls") is True, r
    if path == "/v1/chat/completions" and want != {"json_object": True}:
        assert r.get("constraint_lenient") is None, r


def test_tool_choice_none_with_a_json_answer_is_the_schema(fake, fake_bridge):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("q", tools=TOOLS, tool_choice="none", response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}))
    assert st == 200, body
    assert last_request(fake)["constraint"] == {"json_schema": SCHEMA}
    assert "constraint_or_tool_calls" not in last_request(fake)


def test_json_answer_comes_back_as_content(fake_bridge):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("q", response_format={
        "type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}))
    assert st == 200 and json.loads(body["choices"][0]["message"]["content"]) == {"answer": "yes"}, body


@pytest.mark.parametrize("kw,param,part", [
    ({"response_format": "json"}, "response_format", "an object with a \"type\" expected"),
    ({"response_format": {}}, "response_format.type", "\"text\", \"json_object\" or \"json_schema\""),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "\"yaml\""),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "an object {name, schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name", "required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": SCHEMA}}},
     "response_format.json_schema.name", "1 to 64 of"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": "{}"}}},
     "response_format.json_schema.schema", "a JSON Schema object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": 1}}},
     "response_format.json_schema.strict", "true or false"),
    ({"tool_choice": "required"}, "tool_choice", "needs a non-empty \"tools\""),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "\"sometimes\""),
    ({"tools": TOOLS, "tool_choice": 3}, "tool_choice", "a string or an object"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice.function.name", "expected"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "\"nope\" is not one of the request's tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools"}}, "tool_choice.type", "\"function\" expected"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "cannot be combined with a forced tool call"),
])
def test_bad_values_name_the_field(fake_bridge, kw, param, part):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("q", **kw))
    assert_openai_error(st, body, 400, part, param=param)
