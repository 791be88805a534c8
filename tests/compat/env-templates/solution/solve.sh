#!/bin/bash
set -euo pipefail
printf 'token=%s\nregion=%s\ntarget=%s\n' "$DEPLOY_TOKEN" "$DEPLOY_REGION" "$DEPLOY_TARGET" > deploy.conf  # relative: in the image's WORKDIR
