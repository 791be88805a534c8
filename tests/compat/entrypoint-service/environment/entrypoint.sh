#!/bin/bash
# Prepare the container, then hand over to the command (the harness's keep-alive).
set -e
echo "127.0.0.1 inventory.internal" >> /etc/hosts
python3 /opt/inventory/inventory.py 8080 /opt/inventory/items.json >/var/log/inventory.log 2>&1 &
for _ in $(seq 100); do  # serve before handing over, as a real service's entrypoint would
    python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8080), 0.2)' 2>/dev/null && break
    sleep 0.05
done
exec "$@"
