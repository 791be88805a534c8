# Start the database keep-alive once per container.
if ! pgrep -f /usr/local/bin/db-keepalive > /dev/null 2>&1; then
  setsid /usr/local/bin/db-keepalive > /dev/null 2>&1 < /dev/null &
fi
