#!/bin/bash
awk -F: '$7 == "/bin/bash" { print $1 }' /data/passwd | sort > /app/bash_users.txt
