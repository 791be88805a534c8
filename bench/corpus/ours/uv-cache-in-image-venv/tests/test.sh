#!/bin/bash
# In the shape of Terminal-Bench 2's mailman test.sh: a venv of the verifier's own, made and filled by uv (uv's
# installer fails offline; the image's uv is used).
curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
source $HOME/.local/bin/env
uv venv -p 3.11 /tmp/tb
source /tmp/tb/bin/activate
uv pip install pytest==8.4.1 pytest-json-ctrf==0.3.5 httpx==0.28.1
pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
