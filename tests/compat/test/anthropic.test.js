// SPDX-License-Identifier: MIT
// The official Anthropic SDK (@anthropic-ai/sdk, pinned in package-lock.json) against
// xing4-http's /v1/messages, unchanged, the way Claude Code and SDK scripts call it: create,
// stream (the SDK rebuilds the message from the event sequence), a forced tool call, token
// counting and errors. X4_BASE_URL / X4_FAKE_BASE_URL as in openai.test.js; the Anthropic SDK
// adds /v1 itself.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';

const root = (u) => u.replace(/\/v1\/?$/, '');
const client = new Anthropic({ baseURL: root(process.env.X4_BASE_URL), apiKey: 'unused', maxRetries: 0 });
const fake = new Anthropic({ baseURL: root(process.env.X4_FAKE_BASE_URL), apiKey: 'unused', maxRetries: 0 });
const lastSent = () => readFileSync(process.env.X4_FAKE_RECORD, 'utf8').trim().split('\n').map(JSON.parse).at(-1);

const tools = [{
  name: 'get_weather', description: 'Weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];

test('messages.create with an agent\'s model name', async () => {
  const r = await client.messages.create({
    model: 'claude-sonnet-4-5-20250929', max_tokens: 8, temperature: 0,
    system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'Hello' }],
  });
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.equal(r.model, 'claude-sonnet-4-5-20250929');
  assert.ok(r.id.startsWith('msg_'));
  assert.equal(r.content.at(-1).type, 'text');
  assert.ok(['end_turn', 'max_tokens'].includes(r.stop_reason));
  assert.ok(r.usage.input_tokens + r.usage.cache_read_input_tokens > 0);
  assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 8);
});

test('messages.stream: the SDK rebuilds the same message from the events', async () => {
  const body = { model: 'claude-haiku-4-5', max_tokens: 6, temperature: 0, messages: [{ role: 'user', content: 'Count' }] };
  const stream = client.messages.stream(body);
  const types = [];
  stream.on('streamEvent', (e) => types.push(e.type));
  let text = '';
  stream.on('text', (t) => { text += t; });
  const final = await stream.finalMessage();
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.equal(types.at(-2), 'message_delta');
  const r = await client.messages.create(body);
  assert.equal(final.content.map((b) => b.text ?? '').join(''), r.content.map((b) => b.text ?? '').join(''));
  assert.equal(text, final.content.filter((b) => b.type === 'text').map((b) => b.text).join(''));
  assert.equal(final.stop_reason, r.stop_reason);
  assert.equal(final.usage.output_tokens, r.usage.output_tokens);
});

test('thinking blocks, streamed and not (scripted daemon)', async () => {
  const body = { model: 'claude-sonnet-4-5', max_tokens: 64, thinking: { type: 'enabled', budget_tokens: 1024 },
    messages: [{ role: 'user', content: 'hi' }] };
  const r = await fake.messages.create(body);
  assert.deepEqual(r.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(r.content[0].thinking, 'Let me think.');
  const final = await fake.messages.stream(body).finalMessage();
  assert.deepEqual(final.content, r.content);
  assert.equal(lastSent().thinking_budget, 1024);
});

test('forced tool call and its result round trip (scripted daemon)', async () => {
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const r = await fake.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 64, tools,
    tool_choice: { type: 'tool', name: 'get_weather' }, messages });
  assert.deepEqual(lastSent().constraint, { tool: 'get_weather' });
  assert.equal(r.stop_reason, 'tool_use');
  const use = r.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, { city: 'Paris' });
  // streamed: input_json_delta fragments become the same input
  const final = await fake.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 64, tools,
    tool_choice: { type: 'any' }, messages }).finalMessage();
  assert.deepEqual(final.content.find((b) => b.type === 'tool_use').input, { city: 'Paris' });
  assert.deepEqual(lastSent().constraint, { tool: null });
  messages.push({ role: 'assistant', content: r.content });
  messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] });
  const answer = await fake.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 64, tools, messages });
  assert.equal(answer.content[0].text, 'It is sunny in Paris.');
  assert.deepEqual(lastSent().messages.at(-1), { role: 'tool', content: 'sunny', name: 'get_weather' });
  // the same history is accepted by the real daemon's template
  const real = await client.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 2, tools, messages });
  assert.ok(real.usage.input_tokens + real.usage.cache_read_input_tokens > 40);
});

test('messages.countTokens matches the prompt a create reads', async () => {
  const body = { model: 'claude-sonnet-4-5', system: 'Be brief.', messages: [{ role: 'user', content: 'Hello there' }] };
  const n = await client.messages.countTokens(body);
  assert.ok(n.input_tokens > 5);
  const r = await client.messages.create({ ...body, max_tokens: 1 });
  assert.equal(r.usage.input_tokens + r.usage.cache_read_input_tokens, n.input_tokens);
});

test('errors are the SDK\'s error classes with Anthropic\'s shape', async () => {
  await assert.rejects(
    client.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 8, temperature: 3,
      messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && e.error.type === 'error'
      && e.error.error.type === 'invalid_request_error' && /temperature: 3 is out of range/.test(e.message));
  await assert.rejects(
    client.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 8,
      messages: [{ role: 'user', content: [{ type: 'hologram' }] }] }),
    (e) => e instanceof Anthropic.BadRequestError && /unknown content block type "hologram"/.test(e.error.error.message));
  await assert.rejects(
    client.messages.create({ model: 'gpt-4o', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error');
});
