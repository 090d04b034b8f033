#!/usr/bin/env bash
# Redis services for the test suite: a standalone server and a 6-node cluster.
#
#   scripts/services.sh start STATE_DIR [all|standalone|cluster]
#                                         prints `export ...` lines for pytest
#   scripts/services.sh stop STATE_DIR    stops every server started into STATE_DIR
#
# Servers are started on free ports (never 6379, never a server that happens
# to be running), keep nothing on disk but their cluster config and logs in
# STATE_DIR, and are stopped by `stop`. Only a server the user names is reused,
# and it is never stopped:
#   standalone: $CTXGUARD_TEST_REDIS_URL, if it answers PING;
#   cluster:    $CTXGUARD_TEST_CLUSTER_URL, if every node answers PING.
# CTXGUARD_TEST_REDIS_PRIVATE / CTXGUARD_TEST_CLUSTER_PRIVATE are exported as
# 1 for a server started here and 0 for a reused one: tests marked
# `destructive` (SCRIPT FLUSH, CONFIG SET, CLIENT KILL, ...) only touch a
# private server (see tests/conftest.py).
# Progress goes to stderr; stdout holds only the export lines.
#
# The servers outlive `start` (they are daemons) until `stop`, which finds them by the
# pid files in STATE_DIR, whoever calls it: a caller that can die first hands STATE_DIR
# to a watchdog (tests/reaper.py; scripts/test and the tests' private clusters do). A
# `start` that is interrupted (SIGINT, SIGTERM, SIGHUP) stops what it had started, and a
# `stop` while a `start` still runs into the same STATE_DIR ends that start first.
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

# server_pid PORT: the process id the server on PORT reports.
server_pid() {
  timeout 2 redis-cli -h 127.0.0.1 -p "$1" info server 2>/dev/null | tr -d '\r' |
    awk -F: '$1 == "process_id" {print $2}'
}

# start_server DIR EXTRA_ARGS...: start redis-server on a free port, print the port.
start_server() {
  local dir=$1 port attempt pid
  shift
  mkdir -p "$dir"
  for attempt in 1 2 3 4 5; do
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
      --daemonize yes --dir "$dir" --pidfile "$dir/redis-$port.pid" \
      --logfile "$dir/redis-$port.log" "$@" >&2 || true
    # The port was free a moment ago: the server answering must be the one we
    # started (the pid in its pid file), never someone else's that took the port.
    for _ in $(seq 1 50); do
      pid=$(cat "$dir/redis-$port.pid" 2>/dev/null || true)
      if [[ -n $pid ]] && [[ $(server_pid "$port") == "$pid" ]]; then
        echo "$port" >>"$dir/../ports"
        echo "$port"
        return 0
      fi
      sleep 0.1
    done
    pid=$(cat "$dir/redis-$port.pid" 2>/dev/null || true)
    [[ -z $pid ]] || kill "$pid" 2>/dev/null || true
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
  local state=$1 what=${2:-all} url cluster private
  case $what in all | standalone | cluster) ;; *) die "start: unknown service set '$what'" ;; esac
  mkdir -p "$state"
  : >"$state/ports"
  echo $$ >"$state/start.pid"
  # shellcheck disable=SC2064  # $state is fixed now
  trap "log 'interrupted: stopping what was started'; cmd_stop '$state'; exit 130" INT TERM HUP

  if [[ $what != cluster ]]; then
    private=1
    if [[ -n ${CTXGUARD_TEST_REDIS_URL:-} ]] && ping_url "$CTXGUARD_TEST_REDIS_URL"; then
      url=$CTXGUARD_TEST_REDIS_URL
      private=0
      log "standalone: reusing \$CTXGUARD_TEST_REDIS_URL (destructive tests use their own server)"
    else
      need_binaries
      [[ -n ${CTXGUARD_TEST_REDIS_URL:-} ]] && log "\$CTXGUARD_TEST_REDIS_URL does not answer; starting our own"
      url="redis://127.0.0.1:$(start_server "$state/standalone")/0"
      log "standalone: started ${url}"
    fi
    printf 'export CTXGUARD_TEST_REDIS_URL=%q\n' "$url"
    printf 'export CTXGUARD_TEST_REDIS_PRIVATE=%s\n' "$private"
  fi

  if [[ $what != standalone ]]; then
    private=1
    if [[ -n ${CTXGUARD_TEST_CLUSTER_URL:-} ]] && cluster_url_ok "$CTXGUARD_TEST_CLUSTER_URL"; then
      cluster=$CTXGUARD_TEST_CLUSTER_URL
      private=0
      log "cluster: reusing \$CTXGUARD_TEST_CLUSTER_URL (destructive tests use their own cluster)"
    else
      need_binaries
      [[ -n ${CTXGUARD_TEST_CLUSTER_URL:-} ]] && log "\$CTXGUARD_TEST_CLUSTER_URL does not answer; starting our own"
      cluster=$(start_cluster "$state")
      log "cluster: started $cluster"
    fi
    printf 'export CTXGUARD_TEST_CLUSTER_URL=%q\n' "$cluster"
    printf 'export CTXGUARD_TEST_CLUSTER_PRIVATE=%s\n' "$private"
  fi
  trap - INT TERM HUP
  rm -f "$state/start.pid"
}

# running_start STATE: the pid of a `services.sh start STATE` still running, if any.
running_start() {
  local pid
  pid=$(cat "$1/start.pid" 2>/dev/null || true)
  [[ -n $pid && $pid != "$$" ]] || return 1
  [[ $(ps -ww -o args= -p "$pid" 2>/dev/null) == *services.sh\ start\ "$1"* ]] || return 1
  echo "$pid"
}

# our_server PID DIR: PID is a redis-server running in DIR (never a pid since reused).
our_server() {
  local stat comm cwd
  read -r stat comm < <(ps -o stat=,comm= -p "$1" 2>/dev/null) || return 1
  [[ $stat != Z* && $comm == redis-server* ]] || return 1 # a zombie is gone
  cwd=$(readlink "/proc/$1/cwd" 2>/dev/null) || return 0 # no /proc, or exiting: by name
  [[ $cwd == "$(cd "$2" && pwd -P)" ]]
}

cmd_stop() {
  local state=$1 pidfile pid port dir real proc comm
  [[ -d $state ]] || return 0
  real=$(cd "$state" && pwd -P)
  if pid=$(running_start "$state"); then
    log "stopping the start still running into $state (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 300); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  fi
  # Each server by the pid file it wrote: SHUTDOWN on its port if the server there is
  # that pid, then a signal for one that ignored it.
  while IFS= read -r pidfile; do
    pid=$(cat "$pidfile" 2>/dev/null || true)
    [[ -n $pid ]] || continue
    port=${pidfile##*/redis-}
    port=${port%.pid}
    dir=${pidfile%/*}
    if [[ $(server_pid "$port") == "$pid" ]]; then
      timeout 3 redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    fi
    for _ in $(seq 1 30); do
      our_server "$pid" "$dir" || break
      sleep 0.1
    done
    if our_server "$pid" "$dir"; then kill "$pid" 2>/dev/null || true; fi
  done < <(find "$state" -name 'redis-*.pid' 2>/dev/null)
  # A server with no pid file yet (a start cut short as it forked one): by its working
  # directory, which is in STATE_DIR (Linux /proc).
  for proc in /proc/[0-9]*; do
    { read -r comm <"$proc/comm"; } 2>/dev/null || continue
    [[ $comm == redis-server ]] || continue
    [[ $(readlink "$proc/cwd" 2>/dev/null) == "$real"/* ]] || continue
    kill "${proc#/proc/}" 2>/dev/null || true
  done
  rm -rf "$state"
}

case ${1:-} in
  start) cmd_start "${2:?usage: services.sh start STATE_DIR [all|standalone|cluster]}" "${3:-all}" ;;
  stop) cmd_stop "${2:?usage: services.sh stop STATE_DIR}" ;;
  *) die "usage: services.sh start STATE_DIR [all|standalone|cluster] | stop STATE_DIR" ;;
esac
