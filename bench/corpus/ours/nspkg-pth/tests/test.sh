#!/bin/bash
# pytest baked into the image (pip, system-wide) and run by the system's Python, as many Terminal-Bench 2 tasks do.
cd /app
python3 -m pytest /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
