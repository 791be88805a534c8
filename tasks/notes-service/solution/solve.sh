#!/bin/bash
sed -i -e 's/^port = .*/port = 8080/' -e 's|^dir = .*|dir = /srv/notes|' /etc/notes/notes.ini
setsid nohup python3 /opt/notes/server.py > /var/log/notes.log 2>&1 < /dev/null &
for _ in $(seq 50); do
  python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8080/health", timeout=1)' 2>/dev/null && exit 0
  sleep 0.2
done
cat /var/log/notes.log
exit 1
