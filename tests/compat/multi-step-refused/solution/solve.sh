#!/bin/bash
echo 1 > /app/bad_line.txt
sed -i 's/^port = .*/port = 8080/' /etc/app/server.conf
