#!/usr/bin/env bash
# A sandbox host's disk, set up so that a task's storage_mb is a hard kernel limit: an xfs file system mounted with
# project quotas (pquota) at FOLDER, for Docker's data root. On it overlay2 enforces `--storage-opt size`, which
# terminus-env asks of every sandbox (it detects the engine that accepts it). Opt-in: nothing runs this for you.
#
#   sudo scripts/sandbox-host-xfs.sh FOLDER (--device /dev/XYZ | --loop-file PATH --size 200G) [--apply]
#                                    [--configure-docker]
#
# Without --apply it only says what it would do. With --apply it
#   1. makes the file system: on the empty device (one that holds a file system is refused), or on a sparse loop
#      file where the machine has no spare device (xfsprogs is installed from Debian's archive when missing);
#   2. mounts it at FOLDER with pquota and adds the mount to /etc/fstab;
#   3. proves that the kernel enforces a project quota there: a 1 MB quota on a scratch folder, a 2 MB write
#      into it must fail (a kernel built without XFS quota support refuses the mount option: it stops there).
# With --configure-docker as well, it sets "data-root": FOLDER in /etc/docker/daemon.json and restarts Docker.
# The engine then starts empty: its images and containers stay in the old data root, so build or pull again.
# Running it again once FOLDER is mounted with pquota changes nothing.
set -euo pipefail

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
say() { echo "sandbox-host-xfs: $*" >&2; }
fail() { say "$*"; exit 1; }

folder=""; device=""; loop_file=""; size=""; apply=false; configure_docker=false
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device=${2:?}; shift 2 ;;
        --loop-file) loop_file=${2:?}; shift 2 ;;
        --size) size=${2:?}; shift 2 ;;
        --apply) apply=true; shift ;;
        --configure-docker) configure_docker=true; shift ;;
        -h|--help) usage ;;
        -*) say "unknown option $1"; usage ;;
        *) [ -z "$folder" ] || usage; folder=$1; shift ;;
    esac
done
[ -n "$folder" ] || usage
if { [ -n "$device" ] && [ -n "$loop_file" ]; } || { [ -z "$device" ] && [ -z "$loop_file" ]; }; then
    fail "give exactly one of --device and --loop-file"
fi
[ -z "$loop_file" ] || [ -n "$size" ] || fail "--loop-file needs --size (e.g. --size 200G)"
[ "$(id -u)" = 0 ] || fail "run as root: it makes a file system, mounts it and may restart Docker"
folder=$(realpath -m "$folder")

mounted_with_pquota() { findmnt -n -o FSTYPE,OPTIONS --target "$1" 2>/dev/null | grep -Eq '^xfs .*(prjquota|pquota)'; }

prove_quota() {  # a 1 MB project quota on a scratch folder must stop a 2 MB write
    local scratch="$folder/.quota-check" id=2147483641 written=0  # far above the ids Docker hands out
    mkdir -p "$scratch"
    xfs_quota -x -c "project -s -p $scratch $id" "$folder" >/dev/null
    xfs_quota -x -c "limit -p bhard=1m $id" "$folder"
    if dd if=/dev/zero of="$scratch/fill" bs=1M count=2 conv=fsync status=none 2>/dev/null; then written=1; fi
    xfs_quota -x -c "limit -p bhard=0 $id" "$folder"
    rm -rf "$scratch"
    [ "$written" = 0 ] || fail "a 2 MB write went past a 1 MB project quota on $folder: quotas are not enforced"
    say "project quotas are enforced on $folder"
}

if mounted_with_pquota "$folder" && [ "$(findmnt -n -o TARGET --target "$folder")" = "$folder" ]; then
    say "$folder is already xfs mounted with project quotas"
else
    source="${device:-$loop_file}"
    if ! $apply; then
        say "would make xfs on $source${size:+ ($size, sparse)}, mount it at $folder with pquota, add it to /etc/fstab"
        $configure_docker && say "would set data-root $folder in /etc/docker/daemon.json and restart Docker"
        say "nothing changed: add --apply to do it"
        exit 0
    fi
    if ! command -v mkfs.xfs >/dev/null || ! command -v xfs_quota >/dev/null; then
        say "installing Debian's xfsprogs ..."
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq xfsprogs >/dev/null
    fi
    if [ -n "$device" ]; then
        [ -b "$device" ] || fail "$device is not a block device"
        existing=$(blkid -o value -s TYPE "$device" 2>/dev/null || true)
        [ -z "$existing" ] || fail "$device already holds a $existing file system; wipe it yourself if it may go"
    else
        [ ! -e "$loop_file" ] || fail "$loop_file exists; remove it or name another file"
        mkdir -p "$(dirname "$loop_file")"
        truncate -s "$size" "$loop_file"
    fi
    mkfs.xfs -q "$source"
    mkdir -p "$folder"
    [ -z "$(ls -A "$folder")" ] || fail "$folder is not empty; mount over an empty folder (its files would be hidden)"
    options="pquota${loop_file:+,loop}"
    if ! mount -o "$options" "$source" "$folder"; then
        [ -z "$loop_file" ] || rm -f "$loop_file"  # made above: leave nothing behind
        if dmesg 2>/dev/null | tail -5 | grep -q "quota support not available"; then
            fail "this kernel was built without XFS quota support (CONFIG_XFS_QUOTA): no hard limit is possible here;" \
                 "terminus-env's disk watch holds the limit instead"
        fi
        fail "mounting $source at $folder with $options failed (see dmesg)"
    fi
    echo "$source $folder xfs $options 0 0" >> /etc/fstab
    say "mounted $source at $folder with $options (added to /etc/fstab)"
fi
prove_quota

if $configure_docker; then
    config=/etc/docker/daemon.json
    mkdir -p /etc/docker
    python3 - "$config" "$folder" <<'PYTHON'
import json, pathlib, sys
path, folder = pathlib.Path(sys.argv[1]), sys.argv[2]
config = json.loads(path.read_text() or "{}") if path.exists() else {}
config["data-root"] = folder
path.write_text(json.dumps(config, indent=2) + "\n")
PYTHON
    say "set data-root $folder in $config"
    if command -v systemctl >/dev/null && systemctl is-active --quiet docker; then
        systemctl restart docker
        say "restarted Docker; 'docker info' should say: Backing Filesystem: xfs"
    else
        say "restart dockerd yourself so that it reads $config"
    fi
fi
