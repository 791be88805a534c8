#!/bin/bash
set -euo pipefail
sed -i 's/${SHOP_TAG"/${SHOP_TAG:-1.4.2}"/' docker-compose.yml  # relative: in the image's WORKDIR
