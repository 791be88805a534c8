#!/bin/bash
# Run the hidden checks with the image's own pytest; reward 1 only if all pass.
mkdir -p /logs/verifier
if python3 -m pytest -p no:cacheprovider -rA /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
