// SPDX-License-Identifier: MIT
// Frameworks over the openai API, unchanged, against the bridge over the scripted daemon (it
// answers a JSON constraint with {"answer": "yes"} and a forced call of a tool with that tool's
// call): the AI SDK's generateObject (chat and Responses models) and toolChoice: 'required',
// and LangChain's withStructuredOutput (JSON Schema and function calling). What each sends is
// checked in the fake daemon's record: the Constraint the engine enforces.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { generateObject, generateText, tool } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { ChatOpenAI } from '@langchain/openai';
import { z } from 'zod';

const lastSent = () => readFileSync(process.env.X4_FAKE_RECORD, 'utf8').trim().split('\n').map(JSON.parse).at(-1);
const provider = createOpenAI({ baseURL: process.env.X4_FAKE_BASE_URL, apiKey: 'unused' });
const Answer = z.object({ answer: z.string() });

test('AI SDK generateObject over chat completions', async () => {
  const { object } = await generateObject({ model: provider.chat('xing4'), schema: Answer, prompt: 'Yes?', maxRetries: 0 });
  assert.deepEqual(object, { answer: 'yes' });
  assert.equal(lastSent().constraint.json_schema.properties.answer.type, 'string');
});

test('AI SDK generateObject over the Responses API', async () => {
  const { object } = await generateObject({ model: provider.responses('xing4'), schema: Answer, prompt: 'Yes?', maxRetries: 0 });
  assert.deepEqual(object, { answer: 'yes' });
  assert.deepEqual(lastSent().constraint.json_schema.required, ['answer']);
});

test('AI SDK toolChoice: required', async () => {
  const r = await generateText({
    model: provider.chat('xing4'), prompt: 'Weather in Paris?', toolChoice: 'required', maxRetries: 0,
    tools: { get_weather: tool({ description: 'Weather of a city', inputSchema: z.object({ city: z.string() }) }) },
  });
  assert.deepEqual(lastSent().constraint, { tool: null });
  assert.equal(r.toolCalls[0].toolName, 'get_weather');
  assert.deepEqual(r.toolCalls[0].input, { city: 'Paris' });
});

for (const method of ['jsonSchema', 'functionCalling']) {
  test(`LangChain withStructuredOutput (${method})`, async () => {
    const model = new ChatOpenAI({ model: 'xing4', apiKey: 'unused', maxRetries: 0,
      configuration: { baseURL: process.env.X4_FAKE_BASE_URL } });
    const out = await model.withStructuredOutput(Answer, { name: 'answer', method }).invoke('Yes?');
    assert.deepEqual(out, { answer: 'yes' });
    const c = lastSent().constraint;
    if (method === 'jsonSchema') assert.equal(c.json_schema.properties.answer.type, 'string');
    else assert.deepEqual(c, { tool: 'answer' });
  });
}
