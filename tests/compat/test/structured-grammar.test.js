// SPDX-License-Identifier: MIT
// Structured output from the real daemon on the random-weight demo model: only the engine's
// constrained decoding (GenerateRequest.constraint, the grammar work of the same issue) makes
// a random model answer JSON valid against a schema, or call a forced tool with valid arguments.
// The other files check that these requests reach the daemon as the right Constraint (scripted
// daemon); this one checks what comes back, so it passes only with the engine's grammar work.
// An answer the token budget cut short is not judged (a valid prefix); at least half must end.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';

const client = new OpenAI({ baseURL: process.env.X4_BASE_URL, apiKey: 'unused', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: process.env.X4_BASE_URL.replace(/\/v1\/?$/, ''), apiKey: 'unused', maxRetries: 0 });
const noThinking = { chat_template_kwargs: { enable_thinking: false } };

const Person = z.object({
  name: z.string(), age: z.number().int(), tags: z.array(z.enum(['a', 'b', 'c'])), married: z.boolean().nullable(),
});

test('zod response_format: 10 seeded answers parse and validate', async () => {
  let ended = 0;
  for (let seed = 1; seed <= 10; seed++) {
    const r = await client.chat.completions.create({ model: 'xing4', seed, max_tokens: 512, ...noThinking,
      messages: [{ role: 'user', content: 'Describe a person.' }], response_format: zodResponseFormat(Person, 'person') });
    if (r.choices[0].finish_reason === 'length') continue;
    ended++;
    Person.parse(JSON.parse(r.choices[0].message.content));
  }
  assert.ok(ended >= 5, `only ${ended} of 10 answers ended within 512 tokens`);
});

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } },
    required: ['city', 'days'], additionalProperties: false } } }];

test('forced tool calls: 10 seeded calls have schema-valid arguments', async () => {
  let ended = 0;
  for (let seed = 1; seed <= 10; seed++) {
    const r = await client.chat.completions.create({ model: 'xing4', seed, max_tokens: 512, ...noThinking, tools,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      messages: [{ role: 'user', content: 'Weather?' }] });
    if (r.choices[0].finish_reason === 'length') continue;
    ended++;
    const call = r.choices[0].message.tool_calls?.[0];
    assert.ok(call, `seed ${seed}: no tool call: ${JSON.stringify(r.choices[0].message)}`);
    assert.equal(call.function.name, 'get_weather');
    const args = JSON.parse(call.function.arguments);
    assert.equal(typeof args.city, 'string');
    assert.ok(Number.isInteger(args.days));
    assert.deepEqual(Object.keys(args).sort(), ['city', 'days']);
  }
  assert.ok(ended >= 5, `only ${ended} of 10 calls ended within 512 tokens`);
});

test('Anthropic forced tool on the real daemon', async () => {
  const r = await anthropic.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 512,
    tools: [{ name: 'get_weather', input_schema: tools[0].function.parameters }],
    tool_choice: { type: 'tool', name: 'get_weather' }, messages: [{ role: 'user', content: 'Weather?' }] });
  assert.equal(r.stop_reason, 'tool_use');
  const use = r.content.find((b) => b.type === 'tool_use');
  assert.ok(use, JSON.stringify(r.content));
  assert.equal(typeof use.input.city, 'string');
});
