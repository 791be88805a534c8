#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/largest.txt 2>/dev/null)" = "bravo.bin" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
