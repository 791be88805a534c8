#!/bin/bash
set -e
pip install --no-build-isolation --no-index --break-system-packages -e /opt/src/wordstats
