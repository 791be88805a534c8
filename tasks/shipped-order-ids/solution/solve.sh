#!/bin/bash
jq -r '.[] | select(.status == "shipped") | .id' /data/orders.json > /app/shipped.txt
