// SPDX-License-Identifier: MIT
// The official openai client (v6, pinned in package-lock.json) against xing4-http, unchanged:
// what agent CLIs, editors and scripts using the SDK do. Started by tests/compat/run.sh:
//   X4_BASE_URL       bridge over a real xing4d on the demo model (random weights)
//   X4_FAKE_BASE_URL  bridge over tests/bridge/fakedaemon.py (scripted tool calls)
//   X4_SOCKET, X4_X4CTL  to read the daemon's own stats
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.X4_BASE_URL, apiKey: 'unused', maxRetries: 0 });
const fake = new OpenAI({ baseURL: process.env.X4_FAKE_BASE_URL, apiKey: 'unused', maxRetries: 0 });
const noThinking = { chat_template_kwargs: { enable_thinking: false } };

function daemonStats() {
  const out = execFileSync(process.env.X4_X4CTL, ['--socket', process.env.X4_SOCKET, 'stats', '--json']);
  return JSON.parse(out.toString());
}

test('models.list names the served model', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, ['xing4']);
});

test('chat completion, non-streaming', async () => {
  const r = await client.chat.completions.create({
    model: 'xing4', messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello' }],
    max_tokens: 8, temperature: 0, ...noThinking,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('chat completion, streaming with include_usage', async () => {
  const stream = await client.chat.completions.create({
    model: 'xing4', messages: [{ role: 'user', content: [{ type: 'text', text: 'Count' }] }],
    max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true }, ...noThinking,
  });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const withChoice = chunks.filter((c) => c.choices.length > 0);
  const finishes = withChoice.map((c) => c.choices[0].finish_reason).filter((f) => f !== null);
  assert.equal(finishes.length, 1, 'exactly one chunk carries finish_reason');
  assert.equal(withChoice.at(-1).choices[0].finish_reason, finishes[0]);
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  const text = withChoice.map((c) => c.choices[0].delta.content ?? '').join('');
  assert.ok(last.usage.completion_tokens >= 1 && last.usage.completion_tokens <= 6);
  // same request without streaming gives the same greedy text
  const r = await client.chat.completions.create({
    model: 'xing4', messages: [{ role: 'user', content: 'Count' }], max_tokens: 6, temperature: 0, ...noThinking,
  });
  assert.equal(r.choices[0].message.content, text);
});

test('completions (legacy endpoint)', async () => {
  const r = await client.completions.create({ model: 'xing4', prompt: 'The cloud', max_tokens: 5, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(r.usage.completion_tokens <= 5);
  const stream = await client.completions.create({
    model: 'xing4', prompt: 'The cloud', max_tokens: 5, temperature: 0, stream: true,
  });
  let text = '';
  for await (const c of stream) text += c.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
});

test('reasoning fields present with thinking on, absent with it off', async () => {
  const on = await client.chat.completions.create({
    model: 'xing4', messages: [{ role: 'user', content: 'Think' }], max_tokens: 6, temperature: 0,
  });
  assert.equal(typeof on.choices[0].message.reasoning_content, 'string');
  assert.ok(on.choices[0].message.reasoning_content.length > 0);
  assert.equal(on.choices[0].message.reasoning, on.choices[0].message.reasoning_content);
  assert.ok(on.usage.completion_tokens_details.reasoning_tokens > 0);
  const off = await client.chat.completions.create({
    model: 'xing4', messages: [{ role: 'user', content: 'Think' }], max_tokens: 6, temperature: 0, ...noThinking,
  });
  assert.equal(off.choices[0].message.reasoning_content, undefined);
  assert.equal(off.usage.completion_tokens_details.reasoning_tokens, 0);
  // streaming: reasoning arrives as delta.reasoning_content
  const stream = await client.chat.completions.create({
    model: 'xing4', messages: [{ role: 'user', content: 'Think' }], max_tokens: 4, temperature: 0, stream: true,
  });
  let reasoning = '';
  for await (const c of stream) reasoning += c.choices[0]?.delta?.reasoning_content ?? '';
  assert.ok(reasoning.length > 0);
});

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

test('tool calling round trip (scripted daemon: a random model never calls tools)', async () => {
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const first = await fake.chat.completions.create({ model: 'xing4', messages, tools });
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  const call = first.choices[0].message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });

  // streaming: the SDK's stream helper reassembles the argument fragments
  const runner = fake.chat.completions.stream({ model: 'xing4', messages, tools });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.tool_calls[0].function.arguments, '{"city": "Paris"}');
  assert.equal(final.choices[0].finish_reason, 'tool_calls');

  messages.push(first.choices[0].message);
  messages.push({ role: 'tool', tool_call_id: call.id, content: 'sunny, 24C' });
  const answer = await fake.chat.completions.create({ model: 'xing4', messages, tools });
  assert.equal(answer.choices[0].message.content, 'It is sunny in Paris.');
  assert.equal(answer.choices[0].finish_reason, 'stop');
  const sent = readFileSync(process.env.X4_FAKE_RECORD, 'utf8').trim().split('\n').map(JSON.parse).at(-1);
  // the earlier call travels as ChatMessage.tool_calls_json (the daemon's template renders it),
  // the tool result carries the name of the call its tool_call_id answers
  assert.equal(sent.messages[1].content, '');
  assert.deepEqual(sent.messages[1].tool_calls, JSON.parse(JSON.stringify(first.choices[0].message.tool_calls)));
  assert.equal(sent.messages[1].tool_calls[0].function.arguments, '{"city": "Paris"}');
  assert.deepEqual(sent.messages[2], { role: 'tool', content: 'sunny, 24C', name: 'get_weather' });

  // the same conversation is accepted by the real daemon's template and tokenizer
  const real = await client.chat.completions.create({ model: 'xing4', messages, tools, max_tokens: 4 });
  assert.ok(real.usage.prompt_tokens > 40);
});

test('abort mid-stream cancels the request in the daemon', async () => {
  const before = daemonStats().requests_cancelled;
  const ac = new AbortController();
  // ignore_eos: a random model ends some answers within a few tokens, before the abort lands
  const stream = await client.chat.completions.create({
    model: 'xing4', messages: [{ role: 'user', content: 'Go on forever' }], max_tokens: 4000, stream: true,
    ignore_eos: true,
  }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const _ of stream) { // eslint-disable-line no-unused-vars
      if (++n === 3) ac.abort();
    }
  } catch (e) {
    // depending on timing the SDK ends the iteration quietly or throws its abort error
    assert.ok(e.name === 'APIUserAbortError' || e.name === 'AbortError', e.name);
  }
  assert.ok(n >= 3 && n < 100, `stopped reading after ${n} chunks`);
  // the bridge sees the hang-up and cancels; poll the daemon's stats (bounded)
  const deadline = Date.now() + 30000;
  let s = daemonStats();
  while ((s.requests_cancelled !== before + 1 || s.requests.length > 0) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
    s = daemonStats();
  }
  assert.equal(s.requests_cancelled, before + 1);
  assert.equal(s.requests.length, 0);
});

test('a bad request is an APIError with the right status and message', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'xing4', messages: [{ role: 'user', content: 'x' }], top_p: 1.5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'top_p'
      && /top_p: 1\.5 is out of range/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found');
});
