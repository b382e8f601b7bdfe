#!/usr/bin/env bash
# Makes sure PostgreSQL and Redis are running on 127.0.0.1 (5432, 6379). Installs them with
# apt when absent (Debian/Ubuntu), and lets local TCP connections in without a password, the
# way Fallow's defaults expect (postgres://postgres@127.0.0.1:5432/postgres). Idempotent.
set -euo pipefail

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

pg_up() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
redis_up() { (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; }

apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

start_postgres() {
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    echo "installing PostgreSQL…"
    apt_install postgresql
    fresh_pg=1
  fi
  local ver
  ver=$(ls /etc/postgresql | sort -V | tail -n1)
  if [ "${fresh_pg:-0}" = 1 ]; then
    # Our own fresh install: trust local TCP connections, like the development default.
    local hba="/etc/postgresql/$ver/main/pg_hba.conf"
    as_root sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' "$hba"
  fi
  as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start 2>/dev/null \
    || as_root pg_ctlcluster "$ver" main start 2>/dev/null || true
  if [ "${fresh_pg:-0}" = 1 ]; then as_root pg_ctlcluster "$ver" main reload 2>/dev/null || true; fi
}

start_redis() {
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "installing Redis…"
    apt_install redis-server
  fi
  mkdir -p /tmp/fallow-redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /tmp/fallow-redis >/dev/null
}

pg_up || start_postgres
redis_up || start_redis

for i in $(seq 1 50); do
  if pg_up && redis_up; then
    echo "PostgreSQL and Redis are up."
    exit 0
  fi
  sleep 0.2
done
echo "PostgreSQL or Redis did not come up on 127.0.0.1:5432/6379" >&2
exit 1
