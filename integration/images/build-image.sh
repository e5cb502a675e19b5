#!/bin/bash
# Build a local database image for the integration tests from Debian packages
# only: debootstrap a minimal rootfs, add our entrypoint, `docker import` it.
# No container registry is contacted at any point.
#
# usage: build-image.sh [--force] postgres|mariadb
#   postgres -> ticketing-test/postgres:15   (Debian's postgresql-15)
#   mariadb  -> ticketing-test/mariadb:10.11 (Debian's mariadb-server)
# Skips the build when the image already exists, unless --force.
#
# env: DEBOOTSTRAP_CACHE  where downloaded .debs are kept between builds
#                         (default /var/cache/debootstrap-<suite>)
#      DEBIAN_MIRROR      override the mirror read from the apt sources
#      BUILD_NICE         niceness of the build steps (default 10)
set -Eeuo pipefail

force=0 kind=
for a in "$@"; do
  case "$a" in
    --force|-f) force=1 ;;
    postgres|mariadb) kind=$a ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "build-image.sh: unknown argument: $a" >&2; exit 2 ;;
  esac
done
[ -n "$kind" ] || { echo "usage: build-image.sh [--force] postgres|mariadb" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "build-image.sh: must run as root (debootstrap)" >&2; exit 1; }

here=$(cd "$(dirname "$0")" && pwd)
nice_=(nice -n "${BUILD_NICE:-10}")
command -v ionice >/dev/null && nice_=(ionice -c2 -n7 "${nice_[@]}")

case "$kind" in
  postgres)
    pkgs=postgresql-15 tag=ticketing-test/postgres:15
    # STOPSIGNAL SIGINT = PostgreSQL "fast" shutdown, as in the official image
    # (SIGTERM would be "smart" shutdown: wait for every client to leave).
    conf='ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENV PGDATA=/var/lib/postgresql/data
ENV LANG=C.UTF-8
STOPSIGNAL SIGINT
EXPOSE 5432
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]' ;;
  mariadb)
    pkgs=mariadb-server tag=ticketing-test/mariadb:10.11
    conf='ENV LANG=C.UTF-8
STOPSIGNAL SIGTERM
EXPOSE 3306
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["mariadbd"]' ;;
esac

if [ "$force" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
  echo "build-image.sh: $tag already exists, skipping (use --force to rebuild)"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "build-image.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

# Mirror and suite of this machine's apt configuration (deb822 first, then the one-line format).
src=/etc/apt/sources.list.d/debian.sources
if [ -n "${DEBIAN_MIRROR:-}" ]; then
  mirror=$DEBIAN_MIRROR
elif [ -f "$src" ]; then
  mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$src")
else
  mirror=$(awk '$1 == "deb" && $3 !~ /security|updates/ {print $2; exit}' /etc/apt/sources.list)
fi
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
[ -n "$mirror" ] && [ -n "$suite" ] || { echo "build-image.sh: cannot tell the Debian mirror/suite from the apt sources" >&2; exit 1; }
cache=${DEBOOTSTRAP_CACHE:-/var/cache/debootstrap-$suite}
mkdir -p "$cache"

root=$(mktemp -d "/var/tmp/ticketing-rootfs-$kind.XXXXXX")
log="$root.log"
# Cleanup even on failure or Ctrl-C: debootstrap mounts /proc, /sys and (in a
# container-like host, /.dockerenv exists here) bind-mounts /dev nodes into the
# target. Unmount whatever is still mounted under $root *before* deleting, and
# never let rm cross into another filesystem.
cleanup() {
  local rc=$? m
  for m in $(awk -v r="$root" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf --one-file-system "$root" "$root.ctx"
  docker rmi "$tag-rootfs" >/dev/null 2>&1 || true
  [ "$rc" = 0 ] && rm -f "$log"
  [ "$rc" = 0 ] || echo "build-image.sh: FAILED ($kind, rc=$rc); debootstrap log kept at $log" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t0=$SECONDS
phase() { echo "[build-image $kind] $(date +%T) +$((SECONDS - t0))s $*"; }

phase "debootstrap $suite from $mirror (+$pkgs), cache $cache ($(ls "$cache" 2>/dev/null | wc -l) .debs cached)"
if ! "${nice_[@]}" debootstrap --variant=minbase --include="$pkgs" --cache-dir="$cache" \
     "$suite" "$root" "$mirror" >"$log" 2>&1; then
  tail -25 "$log" >&2
  exit 1
fi
t_deb=$((SECONDS - t0))

phase "trim"
# package caches, apt lists, docs, and the cluster/datadir that the packages'
# postinst created (the entrypoint makes a fresh one per container).
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/usr/share/info/* \
       "$root"/var/log/*.log "$root"/var/log/apt/* \
       "$root"/var/lib/postgresql/15/main "$root"/etc/postgresql/15/main "$root"/var/lib/mysql/*
install -m 0755 "$here/$kind-entrypoint.sh" "$root/usr/local/bin/docker-entrypoint.sh"
# Sanity: what the entrypoint needs must be in the rootfs.
case "$kind" in
  postgres) need=(usr/lib/postgresql/15/bin/postgres usr/lib/postgresql/15/bin/initdb usr/lib/postgresql/15/bin/pg_ctl usr/bin/psql usr/bin/setpriv) ;;
  mariadb)  need=(usr/sbin/mariadbd usr/bin/mariadb-install-db usr/bin/mariadb usr/bin/mariadb-admin usr/bin/setpriv) ;;
esac
for f in "${need[@]}"; do
  [ -e "$root/$f" ] || [ -L "$root/$f" ] || { echo "build-image.sh: /$f missing from the rootfs" >&2; exit 1; }
done

# `docker import --change` of Docker 20.10 rejects STOPSIGNAL ("stopsignal is
# not a valid change command"), so import the bare rootfs under a temporary tag
# and set the image config with a one-line-per-setting Dockerfile on top of it.
# The classic builder (DOCKER_BUILDKIT=0) uses the local FROM image: no pull.
old=$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
phase "docker import -> $tag-rootfs"
tar -C "$root" --one-file-system --numeric-owner -c . | "${nice_[@]}" docker import \
  -m "integration/images/build-image.sh: $pkgs from $mirror $suite" - "$tag-rootfs" >/dev/null
phase "docker build (image config) -> $tag"
ctx="$root.ctx"; mkdir -p "$ctx"
printf 'FROM %s\n%s\nLABEL org.opencontainers.image.title="%s" org.opencontainers.image.description="%s from Debian %s, built by integration/images/build-image.sh"\n' \
  "$tag-rootfs" "$conf" "$tag" "$pkgs" "$suite" >"$ctx/Dockerfile"
if ! DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$ctx" >"$ctx/build.log" 2>&1; then
  cat "$ctx/build.log" >&2; rm -rf "$ctx"; exit 1
fi
rm -rf "$ctx"
docker rmi "$tag-rootfs" >/dev/null  # only the tag goes: $tag's layer is the same
# --force: drop the image that $tag named before (kept if a container uses it)
if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$tag")" ]; then
  docker rmi "$old" >/dev/null 2>&1 || echo "build-image.sh: previous $tag image $old still in use, left in place"
fi
t_all=$((SECONDS - t0))

size=$(docker image inspect -f '{{.Size}}' "$tag" | numfmt --to=iec)
ver=$(awk -v p="${pkgs%% *}" '$0 == "Package: " p {f=1} f && /^Version:/ {print $2; exit}' "$root/var/lib/dpkg/status")
phase "built $tag ($pkgs $ver, $size): debootstrap ${t_deb}s, total ${t_all}s"
