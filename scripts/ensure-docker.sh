#!/usr/bin/env bash
# Make sure a Docker engine answers. As root on Debian/Ubuntu, install docker.io and start dockerd
# in the background when none runs; otherwise say what to do. Idempotent.
# With --install-only, install the engine's programs when missing and start nothing (the fresh-machine check
# runs it so, in a container where no engine could start).
set -euo pipefail

log=${TERMINUS_DOCKERD_LOG:-/var/log/terminus-dockerd.log}
install_only=false
[ "${1:-}" = "--install-only" ] && install_only=true

engine_answers() { docker info >/dev/null 2>&1; }
raise_limit() { [ -w "$1" ] && [ "$(cat "$1")" -lt "$2" ] && echo "$2" > "$1" || true; }

if [ "$(id -u)" = 0 ] && ! $install_only; then
    # Each running verifier holds four fanotify groups of the host's root user (docs/notes/security.md): the
    # kernel's default of 128 would hold back verifiers beyond 32 at once.
    raise_limit /proc/sys/fs/fanotify/max_user_groups 8192
    # Every container's root is the host's: the kernel's per-user counts of inotify instances and watches and of
    # epoll watches, and the host's count of open files, are shared by every sandbox and the host. Raised past what
    # any sandbox's memory limit lets it allocate (each is charged to its memory: about 1 KiB an inotify instance,
    # 130 bytes a watch, 260 bytes an epoll watch), so no sandbox can use them up for the others.
    raise_limit /proc/sys/fs/inotify/max_user_instances 2147483647
    raise_limit /proc/sys/fs/inotify/max_user_watches 2147483647
    raise_limit /proc/sys/fs/epoll/max_user_watches 4294967295
    raise_limit /proc/sys/fs/file-max 9223372036854775807
    # Terminals: each sandbox may hold 256 (the daemon caps its devpts); room for 1,000 sandboxes.
    raise_limit /proc/sys/kernel/pty/max 262144
fi

if ! $install_only && engine_answers; then
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "No Docker engine answers and you are not root." >&2
    echo "Start one (e.g. 'sudo systemctl start docker', or 'sudo dockerd &') or add yourself to the docker group, then rerun." >&2
    exit 1
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    echo "Installing Debian's docker.io ..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io >/dev/null
fi
$install_only && exit 0

echo "Starting dockerd in the background (log: $log) ..." >&2
nohup dockerd >"$log" 2>&1 &
for _ in $(seq 1 60); do
    if engine_answers; then
        echo "Docker engine is up." >&2
        exit 0
    fi
    sleep 1
done
echo "dockerd did not answer within 60 s; see $log" >&2
tail -n 20 "$log" >&2 || true
exit 1
