#!/usr/bin/env bash
# Make sure `docker compose` (Compose v2) answers: Harbor's docker environment runs every trial through it, and the
# side-by-side test with Harbor's own Terminus 2 needs Harbor. Debian 12 ships only Compose 1.29, so the plugin comes
# from Debian 13's docker-compose package, fetched by apt inside a throwaway container of the base image (the host's
# apt sources stay as they are) and put where the Docker CLI looks for plugins. Idempotent.
set -euo pipefail

if docker compose version >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "docker compose (Compose v2) is missing and you are not root: install Debian 13's docker-compose package," >&2
    echo "or put Compose v2's docker-compose binary in ~/.docker/cli-plugins/, then rerun." >&2
    exit 1
fi
image=${TERMINUS_BASE_IMAGE:-terminus-env/base:bookworm}
plugins=/usr/local/lib/docker/cli-plugins
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "Fetching Compose v2 (Debian 13's docker-compose) ..." >&2
docker run --rm -v "$work:/out" "$image" bash -c '
    set -e
    printf "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n" \
        > /etc/apt/sources.list.d/trixie.sources
    apt-get update -qq >/dev/null
    cd /out && apt-get download -qq docker-compose/trixie 2>/dev/null
    chmod a+r /out/*.deb' >&2
dpkg-deb -x "$work"/docker-compose_*.deb "$work/x"
mkdir -p "$plugins"
install -m 0755 "$work/x/usr/libexec/docker/cli-plugins/docker-compose" "$plugins/docker-compose"
docker compose version >&2
