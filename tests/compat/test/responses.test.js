// SPDX-License-Identifier: MIT
// The openai client's Responses API, models.retrieve and structured output helpers (zod)
// against xing4-http. X4_BASE_URL / X4_FAKE_BASE_URL / X4_FAKE_RECORD as in openai.test.js.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { zodResponseFormat, zodTextFormat } from 'openai/helpers/zod';
import { z } from 'zod';

const client = new OpenAI({ baseURL: process.env.X4_BASE_URL, apiKey: 'unused', maxRetries: 0 });
const fake = new OpenAI({ baseURL: process.env.X4_FAKE_BASE_URL, apiKey: 'unused', maxRetries: 0 });
const lastSent = () => readFileSync(process.env.X4_FAKE_RECORD, 'utf8').trim().split('\n').map(JSON.parse).at(-1);

test('models.retrieve', async () => {
  const m = await client.models.retrieve('xing4');
  assert.equal(m.id, 'xing4');
  assert.equal(m.object, 'model');
  await assert.rejects(client.models.retrieve('gpt-4o'), (e) => e instanceof OpenAI.NotFoundError);
});

test('responses.create, non-streaming', async () => {
  const r = await client.responses.create({ model: 'xing4', instructions: 'Be brief.', input: 'Hello',
    max_output_tokens: 8, temperature: 0, reasoning: { effort: 'none' } });
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(typeof r.output_text, 'string');
  assert.equal(r.output.at(-1).type, 'message');
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens <= 8);
});

test('responses.stream gives the same text as create', async () => {
  const body = { model: 'xing4', input: [{ role: 'user', content: [{ type: 'input_text', text: 'Count' }] }],
    max_output_tokens: 6, temperature: 0, reasoning: { effort: 'none' } };
  const stream = client.responses.stream(body);
  const types = [];
  let text = '';
  let last;
  stream.on('event', (e) => { types.push(e.type); last = e; });
  stream.on('response.output_text.delta', (e) => { text += e.delta; });
  const final = await stream.finalResponse();
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)));
  const r = await client.responses.create(body);
  const streamed = final.output.filter((o) => o.type === 'message').flatMap((o) => o.content).map((c) => c.text).join('');
  assert.equal(streamed, r.output_text);
  assert.equal(text, r.output_text);
  // the SDK takes the final response from response.completed only; response.incomplete has it too
  assert.equal(last.response.status, r.status);
  assert.equal(last.response.usage.output_tokens, r.usage.output_tokens);
});

const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', strict: true,
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false } }];

test('responses function call, then previous_response_id with its output (scripted daemon)', async () => {
  const first = await fake.responses.create({ model: 'xing4', input: 'Weather in Paris?', tools, tool_choice: 'required' });
  assert.deepEqual(lastSent().constraint, { tool: null });
  const call = first.output.find((o) => o.type === 'function_call');
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris' });
  // streamed: the helper collects the arguments
  const final = await fake.responses.stream({ model: 'xing4', input: 'Weather in Paris?', tools }).finalResponse();
  assert.deepEqual(JSON.parse(final.output.find((o) => o.type === 'function_call').arguments), { city: 'Paris' });
  const second = await fake.responses.create({ model: 'xing4', tools, previous_response_id: first.id,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: 'sunny' }] });
  assert.equal(second.output_text, 'It is sunny in Paris.');
  assert.deepEqual(lastSent().messages.at(-1), { role: 'tool', content: 'sunny', name: 'get_weather' });
});

const Answer = z.object({ answer: z.string() });

test('chat.completions.parse with a zod schema (scripted daemon)', async () => {
  const r = await fake.chat.completions.parse({ model: 'xing4', messages: [{ role: 'user', content: 'Yes or no?' }],
    response_format: zodResponseFormat(Answer, 'answer') });
  assert.deepEqual(r.choices[0].message.parsed, { answer: 'yes' });
  const schema = lastSent().constraint.json_schema;
  assert.deepEqual(schema.required, ['answer']);
  assert.equal(schema.properties.answer.type, 'string');
});

test('responses.parse with zodTextFormat (scripted daemon)', async () => {
  const r = await fake.responses.parse({ model: 'xing4', input: 'Yes or no?', text: { format: zodTextFormat(Answer, 'answer') } });
  assert.deepEqual(r.output_parsed, { answer: 'yes' });
  assert.equal(lastSent().constraint.json_schema.properties.answer.type, 'string');
});
