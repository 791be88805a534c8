#!/bin/bash
set -euo pipefail
printf 'token=%s\nregion=%s\ntarget=%s\n' "$DEPLOY_TOKEN" "$DEPLOY_REGION" "$DEPLOY_TARGET" > /app/deploy.conf
