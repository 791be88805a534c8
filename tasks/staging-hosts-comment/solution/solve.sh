#!/bin/bash
awk '
  /^\[.*\][[:space:]]*$/ { in_staging = ($0 ~ /^\[staging\][[:space:]]*$/); print; next }
  in_staging && $0 !~ /^[[:space:]]*$/ && $0 !~ /^[[:space:]]*#/ { print "# " $0; next }
  { print }
' /etc/app/hosts.ini > /tmp/hosts.ini.new && cat /tmp/hosts.ini.new > /etc/app/hosts.ini
