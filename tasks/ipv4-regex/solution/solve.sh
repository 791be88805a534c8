#!/bin/bash
octet='(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])'
echo "${octet}(\\.${octet}){3}" > /app/ipv4.regex
