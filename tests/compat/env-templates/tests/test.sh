#!/bin/bash
# EXPECTED_* come from the same host variables as the container's DEPLOY_*, resolved when the task loaded.
mkdir -p /logs/verifier
expected="$(printf 'token=%s\nregion=%s\ntarget=deploy-%s.internal' "$EXPECTED_TOKEN" "$EXPECTED_REGION" "$EXPECTED_REGION")"
if [ -n "$EXPECTED_TOKEN" ] && [ "$(cat /app/deploy.conf 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "deploy.conf differs from what was expected:"; echo "$expected"
  echo 0 > /logs/verifier/reward.txt
fi
