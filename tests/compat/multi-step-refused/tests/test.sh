#!/bin/bash
# Placeholder: the steps' own tests grade this task.
mkdir -p /logs/verifier
echo 1 > /logs/verifier/reward.txt
