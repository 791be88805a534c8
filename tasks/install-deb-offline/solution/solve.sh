#!/bin/bash
set -e
dpkg -i /opt/debs/*.deb
jq -r .port /app/config.json > /app/port.txt
