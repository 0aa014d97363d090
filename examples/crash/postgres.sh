#!/bin/bash
# PostgreSQL crash recipe: a cluster made on the faulty disk, writers that acknowledge each
# committed transaction, and the check run after the power cut.
#
#   postgres.sh write --fsync on|off [--writers W] [--rows R] [--checkpoint-every N]
#   postgres.sh check
#
# Uses $FAULTLINE_MOUNT (the cluster is $FAULTLINE_MOUNT/pg/data, its unix socket directory
# $FAULTLINE_MOUNT/pg/run: no TCP port, so parallel runs never clash) and $FAULTLINE_ACKS (a
# file outside the faulty disk). Debian's PostgreSQL 15 (/usr/lib/postgresql/15/bin, or $PGBIN).
#
# write: initdb --data-checksums as the `postgres` user (initdb refuses root), then the server
# with fsync=on|off, in private PID and IPC namespaces. Why: every child of the postmaster calls
# setsid(), so killing the command's process group (what faultline does at a power cut) kills
# the postmaster but not its children, which would keep writing to the file system while it is
# torn down; a PID namespace dies as a whole when its first process (this script) is killed.
# The server's System V shared memory segment goes with the IPC namespace, also under SIGKILL;
# dynamic shared memory is `mmap` (files in the data directory, on the faulty disk). W writers
# loop, each with one psql session: each transaction inserts R rows (W, n, i) whose value is a
# function of them and adds 1 to the `tally` row; psql prints "committed n" after the COMMIT
# returned, and only then "W-n" is appended to the acks file. Every N transactions writer 1 runs CHECKPOINT, so data files get written
# (and, with fsync=on, flushed) during the run. Loops until killed.
#
# check: starts the server on the remounted data directory (crash recovery replays the WAL),
# runs pg_amcheck (heap and B-tree checks of every relation, with the amcheck extension
# installed if missing), and checks that every acknowledged transaction's R rows are there
# with the right values: `present`, `lost` (no row left), `corrupt` (some rows missing or
# wrong). `extra` counts transactions found that were never acknowledged (allowed), `tally_ok`
# (1/0) whether the tally equals the number of transactions in the table, `integrity_ok` (1/0)
# whether pg_amcheck was clean (`integrity` says what it found). If the server cannot
# start, `integrity` says so and every acknowledged transaction counts as lost. The last stdout
# line is a JSON object with these numbers; the exit status is 0 only if nothing acknowledged
# is lost or corrupt, pg_amcheck was clean and the tally adds up. The server is stopped before
# the check returns.
set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
ROWS=4
die() { echo "postgres.sh: $*" >&2; exit 2; }
[ -n "${FAULTLINE_MOUNT:-}" ] || die "\$FAULTLINE_MOUNT is not set"
[ -n "${FAULTLINE_ACKS:-}" ] || die "\$FAULTLINE_ACKS is not set (faultline sets it for a command stack with \`acks: true\`)"
[ -x "$PGBIN/postgres" ] || die "no PostgreSQL server at $PGBIN (apt-get install postgresql, or set PGBIN)"
PG=$FAULTLINE_MOUNT/pg
DATA=$PG/data
RUN=$PG/run
export PATH=$PGBIN:$PATH PGHOST=$RUN PGUSER=postgres PGDATABASE=postgres

# The server's settings, both for the writer and the check. Only a unix socket; small memory.
server_opts() {
  echo -c listen_addresses= -c unix_socket_directories="$RUN" -c dynamic_shared_memory_type=mmap \
    -c shared_buffers=16MB -c max_connections=20 -c fsync="$1" -c full_page_writes=on \
    -c logging_collector=off -c log_min_messages=warning
}

# Start the server in the background (it inherits our process group) and wait until it
# accepts connections (crash recovery first); $1 = fsync setting, $2 = seconds to wait.
start_server() {
  # shellcheck disable=SC2046
  postgres -D "$DATA" $(server_opts "$1") >>"$PG/server.log" 2>&1 &
  SERVER=$!
  local deadline=$((SECONDS + $2))
  until pg_isready -q -t 1; do
    kill -0 "$SERVER" 2>/dev/null || { wait "$SERVER" || true; return 1; }
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.1
  done
}

stop_server() {
  [ -n "${SERVER:-}" ] || return 0
  kill -INT "$SERVER" 2>/dev/null || true # fast shutdown
  wait "$SERVER" 2>/dev/null || true
  SERVER=
}

# The value of row ($1, $2, $3) as SQL, in $VALUE: 512 bytes, a function of the three.
value_sql() { VALUE="repeat(md5($1 || ':' || $2 || ':' || $3), 16)"; }

# --- as root: the directories, then this script again as postgres in its own IPC namespace.
# The acks file is opened here (fd 3, append) because the postgres user may not write where
# faultline keeps it.
if [ "$(id -u)" = 0 ]; then
  SELF=$(readlink -f "$0")
  mkdir -p "$RUN"
  chown postgres:postgres "$PG" "$RUN"
  chmod 700 "$RUN"
  [ "${1:-}" = check ] && chown -R postgres:postgres "$PG"
  exec 3>>"$FAULTLINE_ACKS"
  # --kill-child: the namespace's first process gets SIGKILL if unshare itself is killed.
  # The script goes as text, not as its path: postgres may not reach a copy of faultline in a
  # private directory (mktemp -d is mode 700), and a copy on the disk under test would vanish
  # with the power cut while bash still reads it.
  cd /
  exec unshare --ipc --pid --fork --kill-child setpriv --reuid=postgres --regid=postgres --init-groups bash -c "$(cat "$SELF")" postgres.sh "$@"
fi

cmd=${1:-}
shift || true
case $cmd in
write)
  fsync= writers=2 every=100
  while [ $# -gt 0 ]; do
    case $1 in
    --fsync) fsync=$2; shift 2 ;;
    --writers) writers=$2; shift 2 ;;
    --rows) ROWS=$2; shift 2 ;;
    --checkpoint-every) every=$2; shift 2 ;;
    *) die "write: unknown argument $1; allowed: --fsync on|off, --writers W, --rows R, --checkpoint-every N" ;;
    esac
  done
  case $fsync in on | off) ;; *) die "write: --fsync on|off is required" ;; esac
  [ -e /proc/self/fd/3 ] || exec 3>>"$FAULTLINE_ACKS"
  initdb -D "$DATA" --data-checksums -A trust -U postgres >"$PG/initdb.log" 2>&1 || { cat "$PG/initdb.log" >&2; die "initdb failed"; }
  start_server "$fsync" 60 || { tail -5 "$PG/server.log" >&2; die "the server did not start"; }
  psql -X -q -v ON_ERROR_STOP=1 -c "CREATE TABLE rows (w int, txn int, i int, v text, PRIMARY KEY (w, txn, i));
    CREATE TABLE tally (id int PRIMARY KEY, n bigint); INSERT INTO tally VALUES (1, 0); CREATE EXTENSION amcheck; CHECKPOINT;"
  echo "postgres.sh: fsync=$fsync, $writers writers, $ROWS rows per transaction, checkpoint every $every"
  for w in $(seq 1 "$writers"); do
    (
      # one session per writer; `\echo` prints only after the COMMIT before it succeeded (on an
      # error ON_ERROR_STOP ends psql, and the read below sees end of file). psql flushes its
      # output at each command, so the line arrives as soon as the COMMIT returned.
      coproc PSQL { exec psql -X -q -v ON_ERROR_STOP=1; }
      n=1
      while :; do
        value_sql "$w" "$n" i
        printf '%s\n' "BEGIN; INSERT INTO rows SELECT $w, $n, i, $VALUE FROM generate_series(0, $((ROWS - 1))) i;" \
          "UPDATE tally SET n = n + 1 WHERE id = 1; COMMIT;" "\\echo committed $n" >&"${PSQL[1]}"
        if [ "$w" = 1 ] && [ $((n % every)) = 0 ]; then echo CHECKPOINT\; >&"${PSQL[1]}"; fi
        read -r line <&"${PSQL[0]}" || exit 1
        [ "$line" = "committed $n" ] || { echo "postgres.sh: writer $w: psql said $line" >&2; exit 1; }
        # COMMIT returned: only now is it acknowledged
        echo "$w-$n" >&3
        n=$((n + 1))
      done
    ) &
  done
  wait -n || true
  die "a writer failed (the disk went away?)"
  ;;
check)
  [ $# = 0 ] || die "check takes no arguments"
  acked=$(grep -c . "$FAULTLINE_ACKS" 2>/dev/null || true)
  acked=${acked:-0}
  trap stop_server EXIT
  # The crashed server's lock file names a PID of its namespace, which is gone with everything
  # in it; in this new namespace that number may belong to one of our own processes, and the
  # server would then refuse to start.
  rm -f "$DATA/postmaster.pid"
  # The same for the socket's lock file (the cut may also have left it empty, which the server
  # takes for another server starting): the socket directory is ours alone.
  rm -f "$RUN"/.s.PGSQL.*
  if ! start_server on 120; then
    why=$(grep -E 'PANIC|FATAL|ERROR' "$PG/server.log" | tail -1 | tr -d '"\\' | cut -c1-200)
    printf '{"acked": %d, "present": 0, "lost": %d, "corrupt": 0, "extra": 0, "integrity": "server did not start: %s", "integrity_ok": 0, "tally_ok": 0}\n' "$acked" "$acked" "${why:-see $PG/server.log}"
    exit 1
  fi
  integrity=ok
  if ! pg_amcheck --install-missing --heapallindexed --all >"$PG/amcheck.out" 2>&1; then
    integrity="pg_amcheck: $(grep -c . "$PG/amcheck.out") lines: $(head -1 "$PG/amcheck.out" | tr -d '"\\' | cut -c1-160)"
  fi
  # every transaction in the table: w-txn, rows, rows with the right value
  value_sql w txn i
  found=$(psql -X -q -A -t -F ' ' -v ON_ERROR_STOP=1 -c "SELECT w || '-' || txn, count(*), count(*) FILTER (WHERE v = $VALUE) FROM rows GROUP BY w, txn" 2>"$PG/query.err") || {
    integrity="query failed: $(head -1 "$PG/query.err" | tr -d '"\\' | cut -c1-160)"
    found=
  }
  tally=$(psql -X -q -A -t -c "SELECT n FROM tally WHERE id = 1" 2>/dev/null || echo -1)
  stop_server
  trap - EXIT
  # compare: the acks file first (NR==FNR), then the table
  { cat "$FAULTLINE_ACKS" 2>/dev/null || true; echo "--"; printf '%s\n' "$found"; } | awk -v rows="$ROWS" -v tally="$tally" -v integrity="$integrity" '
    /^--$/ { table = 1; next }
    !table { if ($1 != "") acked[$1] = 1; next }
    $1 != "" { ntx++; whole[$1] = ($2 == rows && $3 == rows); seen[$1] = 1 }
    END {
      for (k in acked) { na++; if (!(k in seen)) lost++; else if (whole[k]) present++; else corrupt++ }
      for (k in seen) if (!(k in acked)) { if (whole[k]) extra++; else corrupt++ }
      tok = (tally == ntx) ? 1 : 0
      iok = (integrity == "ok") ? 1 : 0
      printf "{\"acked\": %d, \"present\": %d, \"lost\": %d, \"corrupt\": %d, \"extra\": %d, \"integrity\": \"%s\", \"integrity_ok\": %d, \"tally_ok\": %d}\n", na, present, lost, corrupt, extra, integrity, iok, tok
      exit (lost == 0 && corrupt == 0 && iok && tok) ? 0 : 1
    }'
  ;;
*) die "usage: postgres.sh write --fsync on|off [--writers W] [--rows R] [--checkpoint-every N] | postgres.sh check" ;;
esac
