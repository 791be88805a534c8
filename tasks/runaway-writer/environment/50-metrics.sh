# Start the metrics watchdog once per container.
if ! pgrep -f /usr/lib/metrics/watchdog.sh > /dev/null 2>&1; then
  setsid /usr/lib/metrics/watchdog.sh > /dev/null 2>&1 < /dev/null &
fi
