// SPDX-License-Identifier: MIT
// Coding agents as black boxes: Claude Code 2.0.x (`claude -p`, the last series that runs on
// Node 20) pointed at the bridge with ANTHROPIC_BASE_URL, and Codex (`codex exec` with a custom
// provider, wire_api "responses"), each finish a turn without a protocol error. It runs against the bridge over the scripted daemon, which answers its first request
// (Claude Code always sends its tools) with a tool call and the tool's result with a text
// answer, so the agent's whole loop runs. On the random-weight demo model neither agent can end a
// turn: the model never says end_turn, so Claude Code reports its output budget exceeded (tried
// by hand: its 32,167-token prompt was accepted, prefilled and answered through the bridge) and
// Codex, which sends no output limit, would decode until the context is full.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const cli = join(require.resolve('@anthropic-ai/claude-code/package.json'), '..', 'cli.js');
const codex = join(require.resolve('@openai/codex/package.json'), '..', 'bin', 'codex.js');
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

// Run a CLI with its stdin closed; resolves with stdout when it exits 0.
const runCli = (args, env, cwd, timeout = 120000) => new Promise((resolve, reject) => {
  const p = spawn(process.execPath, args, { env, cwd, stdio: ['ignore', 'pipe', 'pipe'], timeout });
  let stdout = '';
  let stderr = '';
  p.stdout.on('data', (d) => { stdout += d; });
  p.stderr.on('data', (d) => { stderr += d; });
  p.on('error', reject);
  // on failure the tail of its stderr (the head is the CLI's banner; the reason is at the end)
  p.on('close', (code) => (code === 0 ? resolve({ stdout, stderr })
    : reject(new Error(`exit ${code}\n...${stderr.slice(-3000)}\n${stdout.slice(-1000)}`))));
});

// Codex's config in its home: a custom provider speaking the Responses API to the bridge at url;
// `settings` (top-level keys and tables) go before the provider's table
const codexProvider = (home, url, settings = []) => writeFileSync(join(home, 'config.toml'), [
  'model = "xing4"',
  'model_provider = "xing4d"',
  ...settings,
  '[model_providers.xing4d]',
  'name = "xing4d"',
  `base_url = "${url}"`,
  'wire_api = "responses"',
  '',
].join('\n'));

test('Codex finishes a turn over /v1/responses, tool call included', async () => {
  const home = mkdtempSync(join(tmpdir(), 'x4-codex-'));
  const before = sent().length;
  try {
    codexProvider(home, process.env.X4_FAKE_BASE_URL);
    const env = { PATH: process.env.PATH, HOME: home, CODEX_HOME: home };
    const { stdout, stderr } = await runCli(
      [codex, 'exec', '--skip-git-repo-check', 'What is the weather in Paris?'], env, home);
    assert.equal(stdout.trim(), 'It is sunny in Paris.', stderr);
    // the scripted get_weather call is not one of Codex's tools: it answered the call with an
    // error output, which came back to the daemon as a tool message naming the call
    const reqs = sent().slice(before);
    assert.ok(reqs.length >= 2, JSON.stringify(reqs));
    assert.ok(reqs[0].tools.some((t) => (t.function || t).name === 'shell' || (t.function || t).name === 'exec_command'
      || (t.function || t).name === 'apply_patch'), JSON.stringify(reqs[0].tools.map((t) => (t.function || t).name)));
    assert.ok(reqs.some((q) => q.messages.some((m) => m.role === 'tool' && m.name === 'get_weather')));
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

// The same agent against the real daemon on the trained demo model (models/xing4-demo), with its
// own short system prompt and no tools (`--system-prompt`, `--tools ""`): the model, trained on
// 512-token windows, ends such a turn itself (three of three by hand, under a second each). With
// Claude Code's full first request (~20,000 tokens of system prompt and tools) it is far outside
// what it learned: tried by hand, one run ended its turn after 114 s, another was still writing
// at 6,500 tokens, so that is not a test. What the model says is not judged here: only that
// Claude Code gets well-formed answers from the real daemon and reports success.
test('Claude Code finishes a turn on the trained demo model', {
  skip: process.env.X4_TRAINED_BASE_URL ? false : 'no models/xing4-demo/model.gguf in this tree',
}, async () => {
  const home = mkdtempSync(join(tmpdir(), 'x4-claude-trained-'));
  try {
    const env = {
      PATH: process.env.PATH, HOME: home,
      ANTHROPIC_BASE_URL: process.env.X4_TRAINED_BASE_URL.replace(/\/v1\/?$/, ''), ANTHROPIC_API_KEY: 'sk-unused',
      DISABLE_TELEMETRY: '1', DISABLE_ERROR_REPORTING: '1', DISABLE_AUTOUPDATER: '1',
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    };
    const { stdout } = await runCli([cli, '-p', 'What does tar do?', '--tools', '',
      '--system-prompt', 'You answer questions about Debian commands.', '--output-format', 'json'], env, home);
    const r = JSON.parse(stdout);
    assert.equal(r.subtype, 'success', stdout);
    assert.equal(r.is_error, false, stdout);
    assert.equal(r.num_turns, 1, stdout);
    assert.ok(r.result.length > 0, stdout);
    assert.ok(r.usage.output_tokens > 0, stdout);
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

// Codex against the same real daemon, like Claude Code above with short instructions of its own
// and almost no tools: its config turns off the shell, subagent, goal, image and web-search tools
// and the skills and environment blocks, leaving request_user_input (always sent) and ~1,600
// tokens (its whole request runs against the scripted daemon, above). With Codex's whole default
// request (~7,600 tokens of instructions and 9 tools) the trained model is far outside the
// 512-token windows it learned from, and on a CI machine like ours (2 cores, AVX2, before the
// AVX2 attention kernels kept their sums in registers) its prefill alone took ~200 s on the one
// thread: a CI run that finished took 236 s, one was cut at 300 s still writing. Codex sends no
// output limit and no temperature, so the daemon's own limit applies (run.sh starts this daemon
// with --max-tokens 1024) and the model samples at 1:
// by hand on such a machine, 11 of 20 runs ended their turn in 2-11 s (some after calling
// request_user_input, which Codex answers with an error: the loop runs), the other 9 ended
// "Incomplete response returned, reason: max_output_tokens" (exit 1) after 14-18 s. That answer is
// well-formed (Codex's "Incomplete response" is the Responses API's own incomplete_details), so
// such a try is retried, up to twelve tries (all twelve incomplete at 9 in 20: ~7 in 100,000); any
// other failure fails at once. The answer is not judged: only that Codex finishes a turn over the
// real daemon without a protocol error.
test('Codex finishes a turn on the trained demo model', {
  skip: process.env.X4_TRAINED_BASE_URL ? false : 'no models/xing4-demo/model.gguf in this tree',
}, async () => {
  const tries = 12;
  for (let t = 1; ; t++) {
    const home = mkdtempSync(join(tmpdir(), 'x4-codex-trained-'));
    try {
      writeFileSync(join(home, 'instructions.md'), 'You answer questions about Debian commands.\n');
      codexProvider(home, process.env.X4_TRAINED_BASE_URL, [
        `model_instructions_file = "${join(home, 'instructions.md')}"`,
        'include_environment_context = false',
        'include_apps_instructions = false',
        'include_collaboration_mode_instructions = false',
        'web_search = "disabled"',
        '[skills]', 'include_instructions = false',
        '[agents]', 'enabled = false',
        '[features]', 'goals = false', 'view_image = false', 'shell_tool = false', 'unified_exec = false',
      ]);
      const env = { PATH: process.env.PATH, HOME: home, CODEX_HOME: home };
      const { stderr } = await runCli([codex, 'exec', '--skip-git-repo-check', 'What does tar do?'], env, home,
        120000);
      // exit 0 (an incomplete response or a protocol error exits 1: runCli rejects), and `codex
      // exec` prints the tokens used when the turn completed; the model's own text may say anything
      assert.match(stderr, /^tokens used$/m, stderr.slice(-2000));
      return;
    } catch (e) {
      if (t === tries || !/Incomplete response returned, reason: max_output_tokens/.test(e.message)) throw e;
      console.log(`try ${t}: the model wrote past the daemon's output limit; trying again`);
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  }
});
