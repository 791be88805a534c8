#!/bin/bash
# The project's own suite, and the verifier's, run by the system's pytest baked into the image.
cd /app
python3 -m pytest tests /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
