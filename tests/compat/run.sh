#!/bin/bash
# Client compatibility: the official `openai` and `@anthropic-ai/sdk` npm clients, the AI SDK and
# LangChain (pinned in package-lock.json) against xing4-http over a real xing4d on the demo model,
# plus a second bridge over the scripted fake daemon (tests/bridge/fakedaemon.py) for the tool
# calls and structured answers a random model never makes. test/structured-grammar.test.js needs
# the engine's constrained decoding (it checks real structured output from the demo model).
# Usage: tests/compat/run.sh BUILD_DIR   (TAP output: BUILD_DIR/node-compat.tap)
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=$(cd "$1" && pwd)
for b in daemon/xing4d cli/x4ctl http-bridge/xing4-http tools/x4-mkmodel; do
        [ -x "$build/$b" ] || { echo "$build/$b is missing: build first" >&2; exit 2; }
done

(cd "$here" && npm ci --no-audit --no-fund --loglevel=error)

tmp=$(mktemp -d)
pids=()
cleanup() {
        for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
        wait 2>/dev/null || true
        rm -rf "$tmp"
}
trap cleanup EXIT

"$build/tools/x4-mkmodel" --preset demo --out "$tmp/demo.gguf" --quiet --threads 2
printf '[xing4d]\ncache-pages = 64\npage_tokens = 256\nmax-running = 4\n' >"$tmp/xing4d.conf"
"$build/daemon/xing4d" --config "$tmp/xing4d.conf" --model "$tmp/demo.gguf" --device cpu --threads 1 \
        --listen "$tmp/xing4d.sock" --state-dir "$tmp" 2>"$tmp/xing4d.log" &
pids+=($!)
for _ in $(seq 1 600); do
        "$build/cli/x4ctl" --socket "$tmp/xing4d.sock" health >/dev/null 2>&1 && break
        sleep 0.1 # polling the daemon's health: it answers once the model is loaded
done
"$build/cli/x4ctl" --socket "$tmp/xing4d.sock" health >/dev/null || { cat "$tmp/xing4d.log"; exit 1; }

# the trained demo model (models/xing4-demo, in the tree): the agent CLIs against a real model that
# ends its turns (test/agents.test.js); absent in a tree without it, those tests say so and skip.
# --max-tokens 1024: the output limit of a request that sets none (Codex), so that a try the model
# writes on and on ends in seconds (that test retries it), not when the context is full
trained="$src/models/xing4-demo/model.gguf"
if [ -f "$trained" ]; then
        "$build/daemon/xing4d" --config "$tmp/xing4d.conf" --model "$trained" --device cpu --threads 1 \
                --max-tokens 1024 \
                --listen "$tmp/trained.sock" --state-dir "$tmp/trained-state" 2>"$tmp/trained.log" &
        pids+=($!)
        for _ in $(seq 1 600); do
                "$build/cli/x4ctl" --socket "$tmp/trained.sock" health >/dev/null 2>&1 && break
                sleep 0.1
        done
        "$build/cli/x4ctl" --socket "$tmp/trained.sock" health >/dev/null || { cat "$tmp/trained.log"; exit 1; }
fi

mkfifo "$tmp/fake.in"
/usr/bin/python3 "$src/tests/bridge/fakedaemon.py" --socket "$tmp/fake.sock" \
        --record "$tmp/fake-requests.jsonl" <"$tmp/fake.in" >"$tmp/fake.out" &
pids+=($!)
exec 9>"$tmp/fake.in" # holds the fake daemon's stdin open until we exit

start_bridge() { # $1 socket, $2 log
        : >"$2" # exists before the sed below reads it (under set -e a failed read ends the run)
        "$build/http-bridge/xing4-http" --config /dev/null --listen 127.0.0.1:0 --socket "$1" 2>"$2" &
        pids+=($!)
        for _ in $(seq 1 100); do
                port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\)/.*|\1|p' "$2")
                [ -n "$port" ] && return 0
                sleep 0.1
        done
        cat "$2" >&2
        return 1
}
for _ in $(seq 1 100); do grep -q ready "$tmp/fake.out" 2>/dev/null && break; sleep 0.1; done
start_bridge "$tmp/xing4d.sock" "$tmp/bridge.log"
real_port=$port
start_bridge "$tmp/fake.sock" "$tmp/bridge-fake.log"
fake_port=$port

if [ -f "$trained" ]; then
        start_bridge "$tmp/trained.sock" "$tmp/bridge-trained.log"
        export X4_TRAINED_BASE_URL="http://127.0.0.1:$port/v1"
fi

export X4_BASE_URL="http://127.0.0.1:$real_port/v1"
export X4_FAKE_BASE_URL="http://127.0.0.1:$fake_port/v1"
export X4_SOCKET="$tmp/xing4d.sock"
export X4_X4CTL="$build/cli/x4ctl"
export X4_FAKE_RECORD="$tmp/fake-requests.jsonl"
status=0
(cd "$here" && node --test --test-reporter=tap test/) >"$build/node-compat.tap" || status=$?
grep -E '^# (tests|pass|fail)' "$build/node-compat.tap" || true
if [ $status -ne 0 ]; then
        grep -B2 -A40 '^not ok' "$build/node-compat.tap" | head -160
        for log in bridge.log bridge-fake.log bridge-trained.log trained.log; do
                if [ -s "$tmp/$log" ]; then echo "--- the last lines of $log"; tail -20 "$tmp/$log"; fi
        done
fi
exit $status
