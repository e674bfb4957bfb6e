#!/bin/bash
# The xing4d demo on a fresh Debian 12 machine (as root): installs the build dependencies, builds,
# starts the daemon on the CPU backend, generates through x4ctl, then through the OpenAI-compatible
# bridge with curl. Leaves nothing running. The model: models/xing4-demo/model.gguf, the trained
# demo model (issue 15, train/README.md), when the tree has it; else the small synthetic demo model
# that x4-mkmodel makes, with random weights: then the text is gibberish, the plumbing is real.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh build
command -v curl >/dev/null || { apt-get install -y -qq curl >/dev/null; }

build=build-demo
if [ ! -f $build/build.ninja ]; then
        meson setup $build -Dcuda=disabled -Drpc=enabled --buildtype=release >/dev/null
fi
ninja -C $build >/dev/null
echo "== built: $build/daemon/xing4d, $build/cli/x4ctl, $build/http-bridge/xing4-http"

trained=models/xing4-demo/model.gguf
if [ -f $trained ]; then
        model=$trained
        echo "== model: $model, the trained demo model (its card: models/xing4-demo/README.md)"
        prompt="What does tar do?"
        think=(--thinking-budget 128 --max-tokens 384)
        question="What does grep do?"
        answer_tokens=256
else
        model=$build/demo/model.gguf
        if [ ! -f $model ]; then
                mkdir -p $build/demo
                $build/tools/x4-mkmodel --preset demo --seed 1 --out $model
        fi
        echo "== model: $model, x4-mkmodel --preset demo: random weights (no $trained in this tree),"
        echo "   so the text is gibberish; the plumbing is real"
        prompt="Write a haiku about the sea."
        think=(--thinking-budget 16 --max-tokens 48)
        question="Say hello."
        answer_tokens=32
fi

run=$(mktemp -d /tmp/xing4d-demo.XXXXXX)
sock=$run/xing4d.sock
daemon_pid=""
bridge_pid=""
cleanup() {
        [ -n "$bridge_pid" ] && kill "$bridge_pid" 2>/dev/null || true
        [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
        rm -rf "$run"
}
trap cleanup EXIT

echo "== starting xing4d on $model (CPU backend)"
$build/daemon/xing4d --model $model --device cpu --listen $sock --state-dir $run/state \
        --log-level warning &
daemon_pid=$!
for _ in $(seq 1 300); do
        $build/cli/x4ctl --socket $sock health >/dev/null 2>&1 && break
        kill -0 $daemon_pid 2>/dev/null || { echo "xing4d exited"; exit 1; }
        sleep 0.1
done
$build/cli/x4ctl --socket $sock info

echo
echo "== x4ctl generate (thinking shown dimmed)"
$build/cli/x4ctl --socket $sock generate --show-think "${think[@]}" --seed 7 "$prompt"
echo

echo "== xing4-http on 127.0.0.1:8000, then curl /v1/chat/completions"
$build/http-bridge/xing4-http --listen 127.0.0.1:8000 --socket $sock &
bridge_pid=$!
for _ in $(seq 1 100); do
        curl -sf http://127.0.0.1:8000/health >/dev/null && break
        sleep 0.1
done
curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{
  "model": "xing4",
  "messages": [{"role": "user", "content": "'"$question"'"}],
  "max_tokens": '"$answer_tokens"',
  "seed": 7
}'
echo
echo "== demo done"
