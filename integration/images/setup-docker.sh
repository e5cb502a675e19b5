#!/bin/bash
# Make a Docker engine answer on this machine and build the integration test
# images, offline (Debian packages only, no container registry).
#   1. apt-get install docker.io debootstrap   (only what is missing; apt-get
#      update only when a package has no install candidate or the install fails)
#   2. start dockerd in the background unless a daemon already answers
#      (log: /var/log/dockerd-ci.log; waits up to 60 s for `docker info`)
#   3. build-image.sh postgres, build-image.sh mariadb (skipped if present)
# Exits non-zero, with dockerd's own error, when the engine cannot run.
#
# usage: setup-docker.sh [--force]     (--force rebuilds the images)
# env:   DOCKERD_LOG (default /var/log/dockerd-ci.log)
#        DOCKERD_STORAGE_DRIVER  override the probed storage driver
#        SKIP_IMAGES=1           only install and start the engine
#
# dockerd flags, and why (see README.md):
#   --iptables=false --ip6tables=false --ip-forward=false
#       the tests run containers with --network host only: no NAT, no
#       forwarding, no rules added to the shared host's firewall, and no
#       dependency on the kernel's netfilter support.
#   --storage-driver=overlay2 (vfs if an overlay mount fails here)
#   --host=unix:///var/run/docker.sock  (never a TCP socket)
set -Eeuo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log=${DOCKERD_LOG:-/var/log/dockerd-ci.log}
force=()
for a in "$@"; do
  case "$a" in
    --force|-f) force=(--force) ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "setup-docker.sh: unknown argument: $a" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "setup-docker.sh: must run as root" >&2; exit 1; }

T0=$SECONDS
say() { echo "[setup-docker] $(date +%T) +$((SECONDS - T0))s $*"; }
die() { echo "[setup-docker] ERROR: $*" >&2; exit 1; }

# "answers" = `docker info` reaches a daemon (it prints ServerVersion only then).
docker_answers() { local v; v=$(timeout 10 docker info -f '{{.ServerVersion}}' 2>/dev/null) && [ -n "$v" ]; }

# ---- 1. packages ------------------------------------------------------------
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  t=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  apt_install() { nice -n 10 apt-get install -y -q --no-install-recommends "${missing[@]}"; }
  need_update=0
  for p in "${missing[@]}"; do
    cand=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')
    if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then need_update=1; fi
  done
  if [ "$need_update" = 1 ]; then
    say "apt-get update (no install candidate for ${missing[*]})"
    apt-get update -q >/dev/null
  fi
  say "apt-get install ${missing[*]}"
  if ! apt_install >/tmp/setup-docker-apt.log 2>&1; then
    if [ "$need_update" = 0 ]; then
      say "install failed (stale package lists?); apt-get update and retry"
      apt-get update -q >/dev/null
      apt_install >/tmp/setup-docker-apt.log 2>&1 || { tail -20 /tmp/setup-docker-apt.log >&2; die "apt-get install ${missing[*]} failed"; }
    else
      tail -20 /tmp/setup-docker-apt.log >&2; die "apt-get install ${missing[*]} failed"
    fi
  fi
  say "installed ${missing[*]} in $((SECONDS - t))s"
else
  say "docker.io and debootstrap already installed"
fi
say "client: $(docker --version) ($(command -v docker)); dockerd: $(dockerd --version 2>/dev/null)"

# ---- 2. daemon --------------------------------------------------------------
dockerd_pids() { pgrep -x dockerd || true; }
if docker_answers; then
  say "a Docker daemon already answers: $(docker version -f '{{.Server.Version}} (API {{.Server.APIVersion}})'), not starting one"
else
  if [ -n "$(dockerd_pids)" ]; then
    # Started (by someone else, or an earlier run) but not answering yet: wait for it.
    say "dockerd is running (pid $(dockerd_pids | tr '\n' ' ')) but does not answer yet; waiting"
  else
    # Stale pid files survive a reboot here (/run is not a tmpfs) and can name a
    # pid now used by another process: dockerd would then refuse to start.
    for pf in /var/run/docker.pid /var/run/docker/containerd/containerd.pid; do
      if [ -f "$pf" ]; then
        p=$(cat "$pf" 2>/dev/null || true)
        comm=$(cat "/proc/$p/comm" 2>/dev/null || true)
        case "$comm" in dockerd|containerd) ;; *) say "removing stale $pf (pid ${p:-?} is ${comm:-gone})"; rm -f "$pf" ;; esac
      fi
    done
    driver=${DOCKERD_STORAGE_DRIVER:-}
    if [ -z "$driver" ]; then
      # overlay2 needs overlayfs on top of /var/lib/docker's filesystem.
      d=$(mktemp -d /var/tmp/ovl-probe.XXXXXX)
      mkdir -p "$d"/{l,u,w,m}
      if mount -t overlay overlay -o "lowerdir=$d/l,upperdir=$d/u,workdir=$d/w" "$d/m" 2>/dev/null; then
        umount "$d/m"; driver=overlay2
      else
        driver=vfs
      fi
      rm -rf --one-file-system "$d"
    fi
    flags=(--host=unix:///var/run/docker.sock --storage-driver="$driver"
           --iptables=false --ip6tables=false --ip-forward=false)
    say "starting: dockerd ${flags[*]} (log $log)"
    echo "=== $(date -Is) setup-docker.sh: dockerd ${flags[*]}" >>"$log"
    # own session: survives this script, its shell and its process group
    setsid nohup dockerd "${flags[@]}" </dev/null >>"$log" 2>&1 &
    started=1; sleep 1
  fi
  t=$SECONDS
  until docker_answers; do
    if [ -n "${started:-}" ] && [ -z "$(dockerd_pids)" ] && ! docker_answers; then
      echo "---- last warnings/errors in $log ----" >&2
      grep -vE 'level=(info|debug)' "$log" | tail -15 >&2
      die "dockerd exited during start-up: $(grep -E 'level=(fatal|error)|^failed|Error' "$log" | tail -1)"
    fi
    if [ $((SECONDS - t)) -ge 60 ]; then
      echo "---- last lines of $log ----" >&2; tail -15 "$log" >&2
      die "no answer from dockerd after 60 s: $(docker info 2>&1 >/dev/null | tail -1)"
    fi
    sleep 0.5
  done
  say "dockerd answers after $((SECONDS - t))s: $(docker version -f '{{.Server.Version}} (API {{.Server.APIVersion}})')"
fi
say "engine: $(docker info -f 'storage={{.Driver}} cgroup={{.CgroupDriver}}/v{{.CgroupVersion}} root={{.DockerRootDir}}')"

# ---- 3. images --------------------------------------------------------------
if [ "${SKIP_IMAGES:-0}" = 1 ]; then say "SKIP_IMAGES=1: not building images"; exit 0; fi
for kind in postgres mariadb; do
  t=$SECONDS
  "$here/build-image.sh" "${force[@]}" "$kind" || die "building the $kind image failed"
  say "$kind image ready in $((SECONDS - t))s"
done
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}} {{.CreatedSince}}' | grep '^ticketing-test/' | sed 's/^/[setup-docker]   /'
say "done in $((SECONDS - T0))s"
