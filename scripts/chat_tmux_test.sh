#!/usr/bin/env bash
# `fusebox chat` in a real terminal: a detached tmux session types into it (send-keys)
# and reads the screen (capture-pane). Checks two turns (the first answer names Paris:
# the chat runs with --exact, f32 activations; see docs/decode.md for the default's answer),
# Ctrl-C during a long answer (the answer stops, the chat goes on), /reset, and Ctrl-D
# (the chat exits with status 0).
#
#   scripts/chat_tmux_test.sh [FUSEBOX_BIN] [MODEL]
#
# Defaults: target/release/fusebox and models/SmolLM2-135M-Instruct.Q4_1.gguf.
# crates/fusebox-cli/tests/chat.rs runs it when tmux and the model are there.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-target/release/fusebox}
model=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[[ -x $bin ]] || { echo "no fusebox binary at $bin" >&2; exit 2; }
[[ -f $model ]] || { echo "no model at $model" >&2; exit 2; }

session=fusebox-chat-test-$$
cleanup() { tmux kill-session -t "$session" 2>/dev/null || true; }
trap cleanup EXIT

# The exit status is printed after the chat ends, and the pane stays for reading it.
tmux new-session -d -s "$session" -x 160 -y 60 \
    "$(printf '%q ' "$bin" chat --exact --model "$model" --temperature 0 --max-tokens 2000 --threads 2); echo EXIT:\$?; sleep 60"

screen() { tmux capture-pane -p -t "$session" -S -500; }
# Lines that are a prompt: "> " (rustyline), possibly with what was typed after it.
prompts() { screen | grep -c '^>' || true; }
fail() {
    echo "FAIL: $*" >&2
    echo "---- screen ----" >&2
    screen >&2
    exit 1
}
# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.2 s.
wait_for() {
    local limit=$1 what=$2
    shift 2
    local end=$((SECONDS + limit))
    until "$@"; do
        ((SECONDS < end)) || fail "timed out after ${limit}s waiting for $what"
        sleep 0.2
    done
}
has() { screen | grep -qF -- "$1"; }
# The answer to the story request has begun: a non-prompt line with text after it.
story_started() { screen | sed -n '/learns to bake bread/,$p' | sed 1d | grep -v '^>' | grep -q '[[:alnum:]]'; }
prompts_at_least() { (($(prompts) >= $1)); }

wait_for 60 "the first prompt" prompts_at_least 1

# Turn 1, then turn 2 on the same cache: each ends with a new prompt.
tmux send-keys -t "$session" "What is the capital of France?" Enter
wait_for 120 "the first answer" prompts_at_least 2
has "Paris" || fail "the first answer does not name Paris"
tmux send-keys -t "$session" "And what is it famous for?" Enter
wait_for 120 "the second answer" prompts_at_least 3
echo "two turns: ok"

# Ctrl-C during a long answer stops it; the chat stays.
# Ctrl-C goes in as soon as the answer shows (--max-tokens 2000 keeps it going on a fast
# machine; an answer that ended before the key would leave nothing to stop).
tmux send-keys -t "$session" "Write a very long story about a dragon who learns to bake bread." Enter
wait_for 120 "the story to begin" story_started
tmux send-keys -t "$session" C-c
wait_for 60 "[stopped] after Ctrl-C" has "[stopped]"
wait_for 30 "the prompt after Ctrl-C" prompts_at_least 4
has "EXIT:" && fail "Ctrl-C ended the chat"
echo "ctrl-c: ok"

# /reset forgets the conversation.
tmux send-keys -t "$session" "/reset" Enter
wait_for 30 "[conversation reset]" has "[conversation reset]"
echo "reset: ok"

# Ctrl-D at the prompt exits with status 0.
tmux send-keys -t "$session" C-d
wait_for 30 "the chat to exit" has "EXIT:"
has "EXIT:0" || fail "the chat exited with a failure"
echo "ctrl-d: ok"
