#!/bin/bash
# Terminal-Bench 1's boilerplate verifier: curl and uv's installer (offline here: the image's uv is used), then a
# uv project in the working folder with pytest added to it.
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
source $HOME/.local/bin/env
if [ "$PWD" = "/" ]; then
    echo "Error: the image sets no working folder"
    exit 1
fi
uv init
uv add pytest==8.4.1
uv run pytest $TEST_DIR/test_outputs.py -rA
