// SPDX-License-Identifier: MIT
// A coding agent as a black box: Claude Code 2.0.x (`claude -p`, the last series that runs on
// Node 20) pointed at the bridge with ANTHROPIC_BASE_URL finishes a turn without a protocol
// error. It runs against the bridge over the scripted daemon, which answers its first request
// (Claude Code always sends its tools) with a tool call and the tool's result with a text
// answer, so the agent's whole loop runs: its ~30k-token system prompt would take the demo model
// minutes to prefill on a CPU.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const cli = join(require.resolve('@anthropic-ai/claude-code/package.json'), '..', 'cli.js');
const sent = () => (existsSync(process.env.X4_FAKE_RECORD)
  ? readFileSync(process.env.X4_FAKE_RECORD, 'utf8').trim().split('\n').map(JSON.parse) : []);

test('Claude Code finishes a turn, tool call included', async () => {
  const home = mkdtempSync(join(tmpdir(), 'x4-claude-'));
  const before = sent().length;
  try {
    const env = {
      PATH: process.env.PATH, HOME: home,
      ANTHROPIC_BASE_URL: process.env.X4_FAKE_BASE_URL.replace(/\/v1\/?$/, ''), ANTHROPIC_API_KEY: 'sk-unused',
      DISABLE_TELEMETRY: '1', DISABLE_ERROR_REPORTING: '1', DISABLE_AUTOUPDATER: '1',
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    };
    // stdin closed: with a pipe open, `claude -p` waits to read more of the prompt from it
    const out = await new Promise((resolve, reject) => {
      const p = spawn(process.execPath, [cli, '-p', 'What is the weather in Paris?', '--output-format', 'json'],
        { env, stdio: ['ignore', 'pipe', 'pipe'], timeout: 120000 });
      let stdout = '';
      let stderr = '';
      p.stdout.on('data', (d) => { stdout += d; });
      p.stderr.on('data', (d) => { stderr += d; });
      p.on('error', reject);
      p.on('close', (code) => (code === 0 ? resolve(stdout) : reject(new Error(`exit ${code}\n${stderr}\n${stdout}`))));
    });
    const r = JSON.parse(out);
    assert.equal(r.subtype, 'success', out);
    assert.equal(r.is_error, false);
    assert.equal(r.result, 'It is sunny in Paris.');
    assert.ok(r.num_turns >= 2, out);
    // its tool result came back as a tool message naming the call
    const reqs = sent().slice(before);
    assert.ok(reqs.some((q) => q.messages.some((m) => m.role === 'tool' && m.name === 'get_weather')));
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});
