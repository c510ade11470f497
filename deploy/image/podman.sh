#!/usr/bin/env bash
# Podman for this project's image, configured by files of its own (CONTAINERS_CONF,
# CONTAINERS_STORAGE_CONF) so the machine's container configuration stays untouched:
# `source deploy/image/podman.sh` sets them, then `eo_base_image` makes the base image when
# it is missing. Settings measured on a machine without an image registry or a Docker engine
# (docs/deploy.md): runc (crun refuses some cgroup layouts), cgroupfs, events in a file,
# ulimits no higher than the hard limits, overlay storage kept in EO_IMAGE_CACHE between
# runs (default ~/.cache/eo-template/podman), the host's network for every build and run
# (the default bridge leaves firewall rules behind).

EO_IMAGE_CACHE="${EO_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eo-template/podman}"
#: the stand-in for the Dockerfile's pinned python:3.11-slim when no registry is reachable
EO_BASE_IMAGE="${EO_BASE_IMAGE:-localhost/python:3.11-slim}"
mkdir -p "$EO_IMAGE_CACHE"

eo_podman_config() {
  local nofile nproc
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  [ "$nofile" = unlimited ] && nofile=1048576
  [ "$nproc" = unlimited ] && nproc=32768
  [ "$nproc" -gt 32768 ] && nproc=32768
  cat > "$EO_IMAGE_CACHE/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
  cat > "$EO_IMAGE_CACHE/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$EO_IMAGE_CACHE/storage"
runroot = "$EO_IMAGE_CACHE/run"
CONF
  export CONTAINERS_CONF="$EO_IMAGE_CACHE/containers.conf"
  export CONTAINERS_STORAGE_CONF="$EO_IMAGE_CACHE/storage.conf"
}

# The base image, bootstrapped from Debian's packages (bookworm: Python 3.11, as the pinned
# python:3.11-slim) when the registry that has the real one is out of reach. The host's
# locally added CA certificates go in, or pip inside the build cannot reach the index.
eo_base_image() {
  if podman image exists "$EO_BASE_IMAGE"; then
    return 0
  fi
  local root mirror
  root=$(mktemp -d)
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  mirror="${mirror:-http://deb.debian.org/debian}"
  echo "bootstrapping $EO_BASE_IMAGE from $mirror (once: it stays in $EO_IMAGE_CACHE)" >&2
  debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates,passwd \
    bookworm "$root" "$mirror" >&2
  rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
  if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >&2
  fi
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import --change 'CMD ["python3"]' - "$EO_BASE_IMAGE" >&2
  rm -rf "$root"
}

eo_podman_config
