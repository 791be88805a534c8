#!/bin/bash
cd /var/log/ssh
zcat -f auth.log* | grep 'Failed password' | sed -E 's/.* from ([0-9.]+) port .*/\1/' \
  | sort | uniq -c | sort -k1,1nr | head -1 | awk '{ print $2, $1 }' > /app/attacker.txt
cat /app/attacker.txt
