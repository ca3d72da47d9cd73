#!/usr/bin/env bash
# Runs the chat page's headless-browser test (crates/fusebox-serve/tests/browser.rs):
# real chromium driven through chromedriver (WebDriver), against `fusebox serve` on
# SmolLM2, or against llama-cpp-python's OpenAI server with the page mounted at `/`.
#
#   scripts/chat_page_browser_test.sh                    # against target/debug/fusebox serve
#   scripts/chat_page_browser_test.sh --peer llama-cpp   # against llama_cpp.server (same API)
#
# Needs: `apt-get install -y chromium chromium-driver`, models/SmolLM2-135M-Instruct.Q4_1.gguf
# (scripts/fetch-smollm2.sh); for --peer llama-cpp, a python with
# `llama-cpp-python[server]` (PYTHON, default /tmp/venv-py/bin/python).
# The screenshots land in target/test-artifacts/chat-page*.png.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--peer" ] && [ "${2:-}" = "llama-cpp" ]; then
    PYTHON=${PYTHON:-/tmp/venv-py/bin/python}
    # The page at `/` and the rest of llama_cpp.server's app unchanged, on the port the
    # test substitutes for {port}. interrupt_requests=False: by default llama_cpp.server
    # ends a running stream as soon as another request arrives.
    launcher=$(mktemp --suffix=.py)
    trap 'rm -f "$launcher"' EXIT
    cat >"$launcher" <<'EOF'
import sys
import uvicorn
from fastapi.responses import HTMLResponse
from llama_cpp.server.app import create_app
from llama_cpp.server.settings import Settings

model, page, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
app = create_app(Settings(model=model, n_threads=1, n_ctx=2048, interrupt_requests=False, verbose=False))
html = open(page, encoding="utf-8").read()
app.add_api_route("/", lambda: HTMLResponse(html), methods=["GET"])
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
EOF
    export FUSEBOX_SERVE_CMD="$PYTHON $launcher ${FUSEBOX_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf} crates/fusebox-serve/assets/chat.html {port}"
    echo "server: $FUSEBOX_SERVE_CMD" >&2
else
    # The test finds the binary beside its own executable (target/debug with the test profile).
    cargo build --profile test -p fusebox-cli
fi

exec cargo test -p fusebox-serve --test browser -- --nocapture
