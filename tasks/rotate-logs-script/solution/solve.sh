#!/bin/bash
cat > /usr/local/bin/rotate-logs <<'SCRIPT'
#!/bin/bash
# rotate-logs DIR [KEEP]: NAME.log -> NAME.log.1 -> ... -> NAME.log.KEEP, then a fresh NAME.log.
set -u
usage() { echo "usage: rotate-logs DIR [KEEP]: $1" >&2; exit 2; }
[ $# -ge 1 ] || usage "DIR is missing"
dir=$1
keep=${2:-3}
[ -d "$dir" ] || usage "$dir is not a folder"
[[ $keep =~ ^[0-9]+$ ]] && [ "$keep" -ge 1 ] || usage "KEEP must be a positive integer, not '$keep'"

shopt -s nullglob
for log in "$dir"/*.log; do
  [ -f "$log" ] || continue
  highest=0
  for old in "$log".*; do
    n=${old##*.}
    [[ $n =~ ^[0-9]+$ ]] && [ "$n" -gt "$highest" ] && highest=$n
  done
  for ((n = highest; n >= 1; n--)); do
    [ -e "$log.$n" ] || continue
    if [ $((n + 1)) -gt "$keep" ]; then rm -f -- "$log.$n"; else mv -- "$log.$n" "$log.$((n + 1))"; fi
  done
  mv -- "$log" "$log.1"
  : > "$log"
done
SCRIPT
chmod 755 /usr/local/bin/rotate-logs
