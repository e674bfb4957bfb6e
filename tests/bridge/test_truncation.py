# SPDX-License-Identifier: MIT
"""Responses API truncation "auto" over the scripted fake daemon, which refuses a prompt of more
than 4000 bytes (as xing4d refuses one over its context) when the system text is
"fake-context-4000": the bridge leaves out the oldest conversation items (a call with its result,
never the system text or the last item) and sends the request again until it fits; "disabled", the
default, answers the refusal."""
import json

from conftest import assert_openai_error

SYSTEM = "fake-context-4000"


def requests(fake, n):
    return [json.loads(x) for x in fake["record"].read_text().splitlines()[-n:]]


def body(input, **kw):
    return {"model": "xing4", "instructions": SYSTEM, "input": input, **kw}


LONG = [{"role": "user", "content": "a" * 1500}, {"role": "assistant", "content": "b" * 1500},
        {"role": "user", "content": "c" * 1500}, {"role": "user", "content": "hi"}]


def test_auto_drops_the_oldest_items_until_the_prompt_fits(fake, fake_bridge):
    st, _, r = fake_bridge.post("/v1/responses", body(LONG, truncation="auto"))
    assert st == 200, r
    assert r["truncation"] == "auto" and r["status"] == "completed"
    refused, sent = requests(fake, 2)
    assert len(refused["messages"]) == 5
    assert sent["messages"] == [{"role": "system", "content": SYSTEM}, *LONG[1:]]


def test_auto_streamed(fake, fake_bridge):
    c = fake_bridge.conn()
    c.request("POST", "/v1/responses", body=json.dumps(body(LONG, truncation="auto", stream=True)),
              headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    data = resp.read().decode()
    c.close()
    assert resp.status == 200, data
    events = [json.loads(b.split("\ndata: ", 1)[1]) for b in data.strip().split("\n\n")]
    assert [e["type"] for e in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] == "response.completed"
    assert requests(fake, 1)[0]["messages"][1:] == LONG[1:]


def test_a_call_goes_with_its_result(fake, fake_bridge):
    items = [{"role": "user", "content": "q"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "b" * 2500},
             {"role": "user", "content": "c" * 1500}, {"role": "user", "content": "hi"}]
    st, _, r = fake_bridge.post("/v1/responses", body(items, truncation="auto"))
    assert st == 200, r
    assert requests(fake, 1)[0]["messages"] == [{"role": "system", "content": SYSTEM},
                                               {"role": "user", "content": "c" * 1500},
                                               {"role": "user", "content": "hi"}]


def test_disabled_answers_the_refusal(fake_bridge):
    for kw in ({}, {"truncation": "disabled"}):
        st, _, r = fake_bridge.post("/v1/responses", body(LONG, **kw))
        e = assert_openai_error(st, r, 400, "context limit of 4000 tokens", "input")
        assert e["code"] == "context_length_exceeded"


def test_auto_cannot_drop_the_last_item(fake_bridge):
    st, _, r = fake_bridge.post("/v1/responses", body([{"role": "user", "content": "a" * 100},
                                                       {"role": "user", "content": "z" * 5000}], truncation="auto"))
    e = assert_openai_error(st, r, 400, "context limit of 4000 tokens", "input")
    assert e["code"] == "context_length_exceeded"


def test_truncation_must_be_auto_or_disabled(fake_bridge):
    st, _, r = fake_bridge.post("/v1/responses", body("hi", truncation="middle"))
    assert_openai_error(st, r, 400, 'truncation: "auto" or "disabled" expected', "truncation")
