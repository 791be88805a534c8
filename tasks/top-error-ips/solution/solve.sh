#!/bin/bash
awk '$9 ~ /^5[0-9][0-9]$/ { print $1 }' /var/log/web/access.log | sort | uniq -c | sort -k1,1nr | head -3 \
  | awk '{ print $1, $2 }' > /app/top_ips.txt
