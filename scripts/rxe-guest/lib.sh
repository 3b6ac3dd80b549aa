# shellcheck shell=bash
# scripts/rxe-guest/lib.sh — synchronisation helpers for the host side and the
# guest side of an rxe-guest run. Source it (bash):
#   host:  . scripts/rxe-guest/lib.sh
#   guest: every bash script `run` starts has it already (BASH_ENV); it is
#          also at "$RXE_LIB" (bash only: it uses local and $SECONDS).
# The shared output directory (host: the --out DIR given to run; guest: /out)
# is the rendezvous: each side creates marker files there and the other waits
# for them. 9p has no cache in the guest, so a file one side creates is seen
# by the other at once. Markers, not TCP probes: a probe would use up a
# one-shot server's only connection (ibv_rc_pingpong, perftest).

# rxe_wait_file PATH [TIMEOUT_S=600] [PID]
#   Wait until PATH exists. Fails (status 1, message on stderr) after
#   TIMEOUT_S seconds, or as soon as process PID (e.g. the background run)
#   has exited.
rxe_wait_file() {
  local path="$1" timeout="${2:-600}" pid="${3:-}" start=$SECONDS
  while [ ! -e "$path" ]; do
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      echo "rxe_wait_file: process $pid exited before $path appeared" >&2
      return 1
    fi
    if [ $((SECONDS - start)) -ge "$timeout" ]; then
      echo "rxe_wait_file: $path did not appear within $timeout s" >&2
      return 1
    fi
    sleep 0.2
  done
}

# rxe_signal PATH [TEXT]
#   Create the marker PATH (atomically: written aside, then renamed), with
#   TEXT as its content.
rxe_signal() {
  printf '%s\n' "${2:-}" >"$1.tmp.$$" && mv -f "$1.tmp.$$" "$1"
}

# rxe_wait_listen PORT [TIMEOUT_S=600] [NETNS]
#   Wait until something listens on TCP PORT (in network namespace NETNS if
#   given, which needs `ip netns exec`), without connecting to it.
rxe_wait_listen() {
  local port="$1" timeout="${2:-600}" ns="${3:-}" start=$SECONDS
  local ss=(ss -Hltn "sport = :$port")
  [ -z "$ns" ] || ss=(ip netns exec "$ns" "${ss[@]}")
  until [ -n "$("${ss[@]}" 2>/dev/null)" ]; do
    if [ $((SECONDS - start)) -ge "$timeout" ]; then
      echo "rxe_wait_listen: nothing listens on TCP port $port after $timeout s" >&2
      return 1
    fi
    sleep 0.2
  done
}
