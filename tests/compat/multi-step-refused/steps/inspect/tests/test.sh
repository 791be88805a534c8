#!/bin/bash
mkdir -p /logs/verifier
[ "$(cat /app/bad_line.txt 2>/dev/null)" = "1" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
