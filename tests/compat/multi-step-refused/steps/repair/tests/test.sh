#!/bin/bash
mkdir -p /logs/verifier
grep -qx 'port = 8080' /etc/app/server.conf && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
