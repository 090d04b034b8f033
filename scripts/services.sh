#!/usr/bin/env bash
# Redis services for the test suite: a standalone server and a 6-node cluster.
#
#   scripts/services.sh start STATE_DIR   prints `export ...` lines for pytest
#   scripts/services.sh stop STATE_DIR    stops every server started into STATE_DIR
#
# A server that is already reachable is reused and never stopped:
#   standalone: $CTXGUARD_TEST_REDIS_URL, else 127.0.0.1:6379 if it answers PING;
#   cluster:    $CTXGUARD_TEST_CLUSTER_URL if every node answers PING.
# Otherwise servers are started on free ports, keep nothing on disk but their
# cluster config and logs in STATE_DIR, and are stopped by `stop`.
# Progress goes to stderr; stdout holds only the export lines.
set -euo pipefail

CLUSTER_NODES=6
PYTHON=${PYTHON:-python3}

log() { printf 'services: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

need_binaries() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-cli)
  if ((${#missing[@]})); then
    log "missing: ${missing[*]}"
    log "install Redis first:  apt-get install redis-server   (Debian/Ubuntu; brew install redis on macOS)"
    exit 1
  fi
}

# ping_url URL: true when the server at a redis:// URL answers PING within ~1 s.
ping_url() {
  command -v redis-cli >/dev/null 2>&1 || return 1
  [[ $(timeout 2 redis-cli -u "$1" ping 2>/dev/null) == PONG ]]
}

ping_port() { [[ $(timeout 2 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null) == PONG ]]; }

# free_port: a port P such that P and P+10000 (the cluster bus) can both be bound now.
free_port() {
  "$PYTHON" - <<'EOF'
import random, socket
for _ in range(200):
    port = random.randint(20000, 45000)
    try:
        for p in (port, port + 10000):
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))
    except OSError:
        continue
    print(port)
    break
else:
    raise SystemExit("no free port pair found")
EOF
}

# start_server DIR EXTRA_ARGS...: start redis-server on a free port, print the port.
start_server() {
  local dir=$1 port attempt
  shift
  mkdir -p "$dir"
  for attempt in 1 2 3 4 5; do
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
      --daemonize yes --dir "$dir" --pidfile "$dir/redis-$port.pid" \
      --logfile "$dir/redis-$port.log" "$@" >&2 || true
    for _ in $(seq 1 50); do
      if ping_port "$port"; then
        echo "$port" >>"$dir/../ports"
        echo "$port"
        return 0
      fi
      sleep 0.1
    done
    log "redis-server did not come up on port $port (attempt $attempt); see $dir/redis-$port.log"
  done
  die "could not start redis-server"
}

cluster_url_ok() {
  local url=$1 hostport
  [[ $url == redis+cluster://* ]] || return 1
  IFS=',' read -ra nodes <<<"${url#redis+cluster://}"
  for hostport in "${nodes[@]}"; do
    ping_url "redis://${hostport##*@}" || return 1
  done
}

cluster_ready() {
  local port info
  for port in "$@"; do
    info=$(redis-cli -p "$port" cluster info 2>/dev/null) || return 1
    grep -q '^cluster_state:ok' <<<"$info" || return 1
    grep -q '^cluster_slots_ok:16384' <<<"$info" || return 1
    grep -q "^cluster_known_nodes:$#" <<<"$info" || return 1
  done
}

start_cluster() {
  local state=$1 ports=() port i
  for ((i = 0; i < CLUSTER_NODES; i++)); do
    port=$(start_server "$state/cluster-$i" --cluster-enabled yes \
      --cluster-config-file nodes.conf --cluster-node-timeout 5000)
    ports+=("$port")
  done
  local addrs=()
  for port in "${ports[@]}"; do addrs+=("127.0.0.1:$port"); done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
    >"$state/cluster-create.log" 2>&1 || {
    cat "$state/cluster-create.log" >&2
    die "redis-cli --cluster create failed"
  }
  for _ in $(seq 1 200); do
    if cluster_ready "${ports[@]}"; then
      local joined
      joined=$(IFS=','; echo "${addrs[*]}")
      echo "redis+cluster://$joined"
      return 0
    fi
    sleep 0.1
  done
  die "cluster did not reach cluster_state:ok with all 16384 slots; logs in $state"
}

cmd_start() {
  local state=$1 url cluster
  mkdir -p "$state"
  : >"$state/ports"

  if [[ -n ${CTXGUARD_TEST_REDIS_URL:-} ]] && ping_url "$CTXGUARD_TEST_REDIS_URL"; then
    url=$CTXGUARD_TEST_REDIS_URL
    log "standalone: reusing \$CTXGUARD_TEST_REDIS_URL"
  elif ping_url "redis://127.0.0.1:6379/0"; then
    url="redis://127.0.0.1:6379/0"
    log "standalone: reusing 127.0.0.1:6379"
  else
    need_binaries
    [[ -n ${CTXGUARD_TEST_REDIS_URL:-} ]] && log "\$CTXGUARD_TEST_REDIS_URL does not answer; starting our own"
    url="redis://127.0.0.1:$(start_server "$state/standalone")/0"
    log "standalone: started ${url}"
  fi

  if [[ -n ${CTXGUARD_TEST_CLUSTER_URL:-} ]] && cluster_url_ok "$CTXGUARD_TEST_CLUSTER_URL"; then
    cluster=$CTXGUARD_TEST_CLUSTER_URL
    log "cluster: reusing \$CTXGUARD_TEST_CLUSTER_URL"
  else
    need_binaries
    cluster=$(start_cluster "$state")
    log "cluster: started $cluster"
  fi
  printf 'export CTXGUARD_TEST_REDIS_URL=%q\n' "$url"
  printf 'export CTXGUARD_TEST_CLUSTER_URL=%q\n' "$cluster"
}

cmd_stop() {
  local state=$1 port pidfile pid
  [[ -d $state ]] || return 0
  if [[ -f $state/ports ]]; then
    while read -r port; do
      [[ -n $port ]] || continue
      timeout 3 redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    done <"$state/ports"
  fi
  # Anything that ignored SHUTDOWN: stop it by the pid it wrote.
  while IFS= read -r pidfile; do
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; fi
  done < <(find "$state" -name 'redis-*.pid' 2>/dev/null)
  rm -rf "$state"
}

case ${1:-} in
  start) cmd_start "${2:?usage: services.sh start STATE_DIR}" ;;
  stop) cmd_stop "${2:?usage: services.sh stop STATE_DIR}" ;;
  *) die "usage: services.sh start|stop STATE_DIR" ;;
esac
