# SPDX-License-Identifier: MIT
"""The Responses API's reasoning items as OpenAI's clients read them: reasoning.summary delivers
the thinking as the item's summary too (one summary_text part; the bridge has no summarizer, so
the summary is the reasoning text itself), streamed with the response.reasoning_summary_* events;
include "reasoning.encrypted_content" adds an encrypted_content a later request restores the
reasoning from (Codex with store false sends the item back); bad values are 400s naming them."""
import base64
import json

import pytest

import sse_fixture
from conftest import assert_openai_error

PREFIX = "xing4-reasoning-v1:"
INCLUDABLES = ["reasoning.encrypted_content", "message.output_text.logprobs", "message.input_image.image_url",
               "computer_call_output.output.image_url", "file_search_call.results", "web_search_call.results",
               "web_search_call.action.sources", "code_interpreter_call.outputs"]


def resp(input="hi", **kw):
    body = {"model": "xing4", "input": input}
    body.update(kw)
    return body


def last_request(fake):
    return json.loads(fake["record"].read_text().splitlines()[-1])


def events(bridge, body):
    data = sse_fixture.stream(bridge, "/v1/responses", {**body, "stream": True})
    return [json.loads(line[len("data: "):]) for line in data.decode().splitlines() if line.startswith("data: ")]


def ours(text):
    return PREFIX + base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("summary", ["auto", "concise", "detailed"])
def test_summary_not_streamed(fake_bridge, summary):
    st, _, body = fake_bridge.post("/v1/responses", resp(reasoning={"summary": summary}))
    assert st == 200, body
    rs = body["output"][0]
    assert rs["type"] == "reasoning" and rs["status"] == "completed"
    assert rs["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    assert rs["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert "encrypted_content" not in rs
    assert body["reasoning"] == {"effort": None, "summary": summary}
    assert body["output"][1]["content"][0]["text"] == "Hello, world"


def test_no_summary_unless_asked(fake_bridge):
    st, _, body = fake_bridge.post("/v1/responses", resp(reasoning={"effort": "high", "summary": None}))
    assert st == 200, body
    assert body["output"][0]["summary"] == [] and "encrypted_content" not in body["output"][0]
    assert body["reasoning"] == {"effort": "high", "summary": None}
    types = [e["type"] for e in events(fake_bridge, resp())]
    assert not [t for t in types if "summary" in t], types


def test_generate_summary_is_the_old_name(fake_bridge):
    st, _, body = fake_bridge.post("/v1/responses", resp(reasoning={"generate_summary": "concise"}))
    assert st == 200, body
    assert body["output"][0]["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    assert body["reasoning"]["summary"] == "concise"


def test_summary_streamed(fake_bridge):
    ev = events(fake_bridge, resp(reasoning={"summary": "auto"}))
    assert [e["type"] for e in ev] == [
        "response.created", "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added", "response.content_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
        "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in ev] == list(range(len(ev)))
    rid = ev[2]["item"]["id"]
    assert ev[2]["item"] == {"id": rid, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
    strip = ("type", "sequence_number")
    assert {k: v for k, v in ev[3].items() if k not in strip} == {
        "item_id": rid, "output_index": 0, "summary_index": 0, "part": {"type": "summary_text", "text": ""}}
    assert {k: v for k, v in ev[5].items() if k not in strip} == {
        "item_id": rid, "output_index": 0, "summary_index": 0, "delta": "Let me think."}
    assert {k: v for k, v in ev[7].items() if k not in strip} == {
        "item_id": rid, "output_index": 0, "summary_index": 0, "text": "Let me think."}
    assert {k: v for k, v in ev[8].items() if k not in strip} == {
        "item_id": rid, "output_index": 0, "summary_index": 0,
        "part": {"type": "summary_text", "text": "Let me think."}}
    item = ev[11]["item"]
    assert item["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    assert item["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    done = ev[-1]["response"]
    assert done["output"][0] == item and done["reasoning"]["summary"] == "auto"
    # the stored response says the same
    st, _, got = fake_bridge.request("GET", f"/v1/responses/{done['id']}")
    assert st == 200 and got["output"] == done["output"], got


def test_summary_streamed_in_pieces_and_cut(fake_bridge):
    # two reasoning chunks, then the budget runs out: each piece is a summary delta, the done
    # events carry the whole text, the item is incomplete
    ev = events(fake_bridge, resp("think-long", reasoning={"summary": "detailed"}))
    deltas = [e["delta"] for e in ev if e["type"] == "response.reasoning_summary_text.delta"]
    assert deltas == ["Thinking", " on and on"]
    done = [e for e in ev if e["type"] == "response.reasoning_summary_text.done"]
    assert [e["text"] for e in done] == ["Thinking on and on"]
    item = [e for e in ev if e["type"] == "response.output_item.done"][0]["item"]
    assert item["status"] == "incomplete"
    assert item["summary"] == [{"type": "summary_text", "text": "Thinking on and on"}]
    assert ev[-1]["type"] == "response.incomplete"


@pytest.mark.parametrize("kw,param,part", [
    ({"reasoning": {"summary": "verbose"}}, "reasoning.summary", "\"auto\", \"concise\" or \"detailed\" expected"),
    ({"reasoning": {"summary": True}}, "reasoning.summary", "\"auto\", \"concise\" or \"detailed\" expected"),
    ({"reasoning": {"generate_summary": "short"}}, "reasoning.generate_summary", "\"auto\", \"concise\""),
    ({"include": "reasoning.encrypted_content"}, "include", "an array of strings expected, got a string"),
    ({"include": [7]}, "include[0]", "a string expected, got an integer"),
    ({"include": ["reasoning.encrypted_content", "reasoning.raw_text"]}, "include[1]",
     "\"reasoning.raw_text\" is not a value include takes"),
])
def test_bad_values_name_the_field(fake_bridge, kw, param, part):
    st, _, out = fake_bridge.post("/v1/responses", resp(**kw))
    e = assert_openai_error(st, out, 400, part, param=param)
    assert e["message"].startswith(param + ": "), e


def test_documented_include_values_are_accepted(fake_bridge):
    # those that do not apply here (hosted tools, images, logprobs) change nothing
    st, _, body = fake_bridge.post("/v1/responses", resp(include=INCLUDABLES))
    assert st == 200, body
    assert body["output"][0]["encrypted_content"] == PREFIX + base64.b64encode(b"Let me think.").decode()
    for include in (INCLUDABLES[1:], [], None):
        st, _, body = fake_bridge.post("/v1/responses", resp(include=include))
        assert st == 200, body
        assert "encrypted_content" not in body["output"][0]


def test_encrypted_content_round_trip(fake, fake_bridge):
    """Codex with store false: the reasoning comes back as the item it was given, and the daemon
    sees it again as the assistant turn's reasoning, with no state kept here."""
    first = resp("hi", store=False, include=["reasoning.encrypted_content"], reasoning={"summary": "auto"})
    st, _, body = fake_bridge.post("/v1/responses", first)
    assert st == 200, body
    rs, msg = body["output"]
    assert rs["encrypted_content"].startswith(PREFIX), rs
    assert base64.b64decode(rs["encrypted_content"][len(PREFIX):]).decode() == "Let me think."
    # only the encrypted content comes back (Codex's items may carry no text of their own)
    back = {"type": "reasoning", "id": rs["id"], "summary": [], "encrypted_content": rs["encrypted_content"]}
    second = resp([{"role": "user", "content": "hi"}, back, msg, {"role": "user", "content": "again"}],
                  store=False, include=["reasoning.encrypted_content"])
    st, _, body = fake_bridge.post("/v1/responses", second)
    assert st == 200, body
    assert last_request(fake)["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello, world", "reasoning": "Let me think."},
        {"role": "user", "content": "again"}]


def test_encrypted_content_streamed_round_trip(fake, fake_bridge):
    ev = events(fake_bridge, resp("hi", store=False, include=["reasoning.encrypted_content"]))
    added = [e["item"] for e in ev if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in ev if e["type"] == "response.output_item.done"]
    assert "encrypted_content" not in added[0]  # the text is not known yet
    assert done[0]["encrypted_content"].startswith(PREFIX) and done[0]["summary"] == []
    assert ev[-1]["response"]["output"][0] == done[0]
    st, _, body = fake_bridge.post("/v1/responses", resp(
        [{"role": "user", "content": "hi"}, done[0], done[1], {"role": "user", "content": "again"}], store=False))
    assert st == 200, body
    assert last_request(fake)["messages"][1] == {"role": "assistant", "content": "Hello, world",
                                                 "reasoning": "Let me think."}


@pytest.mark.parametrize("text", ["a", "ab", "abc", "d\u00e9j\u00e0 vu \u2713", "line\nbreak"])
def test_encrypted_content_restores_any_text(fake, fake_bridge, text):
    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "not this"}],
            "encrypted_content": ours(text)}
    st, _, body = fake_bridge.post("/v1/responses", resp([item, {"role": "assistant", "content": "ok"},
                                                          {"role": "user", "content": "q"}]))
    assert st == 200, body
    assert last_request(fake)["messages"][0] == {"role": "assistant", "content": "ok", "reasoning": text}


def test_another_servers_encrypted_content_keeps_the_text_sent(fake, fake_bridge):
    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Summed up."}],
            "encrypted_content": "gAAAAABoZ2V0LXJlYWR5"}
    st, _, body = fake_bridge.post("/v1/responses", resp([item, {"role": "assistant", "content": "ok"},
                                                          {"role": "user", "content": "q"}]))
    assert st == 200, body
    assert last_request(fake)["messages"][0] == {"role": "assistant", "content": "ok", "reasoning": "Summed up."}


@pytest.mark.parametrize("enc", [PREFIX + "not base64!", PREFIX + "YWJj=", PREFIX + "YQ==YWJj",
                                 PREFIX + base64.b64encode(b"\xff\xfe").decode()])
def test_damaged_encrypted_content_of_ours_is_a_400(fake_bridge, enc):
    item = {"type": "reasoning", "summary": [], "encrypted_content": enc}
    st, _, out = fake_bridge.post("/v1/responses", resp([{"role": "user", "content": "q"}, item,
                                                         {"role": "assistant", "content": "ok"}]))
    e = assert_openai_error(st, out, 400, "damaged", param="input[1].encrypted_content")
    assert e["code"] == "invalid_encrypted_content", e
