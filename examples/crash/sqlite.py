#!/usr/bin/env python3
"""SQLite crash recipe: a WAL-mode writer that acknowledges each commit, and the check run
after the power cut.

  sqlite.py write --sync full|normal|off [--rows R] [--max N]
  sqlite.py check [--rows R]

Both use $FAULTLINE_MOUNT (the file system on the faulty disk: the database is
$FAULTLINE_MOUNT/app.db) and $FAULTLINE_ACKS (a file outside that disk).

write: transaction n inserts R rows (n, i) whose value is a function of (n, i) and adds 1 to
the single `tally` row, then COMMITs; only after COMMIT returned is the line "n" appended to
the acks file (one write(2) to an O_APPEND file: it is in the host's page cache at once and
survives the writer being killed). It loops until it is killed (or N transactions).

check: opens the database (SQLite replays the WAL), runs PRAGMA integrity_check, and for
every acknowledged transaction checks that its R rows are there with the right values.
A transaction is `present` (all rows right), `lost` (no row left) or `corrupt` (some rows
missing or wrong: SQLite commits atomically, so this is a failure too). `extra` counts
transactions found that were never acknowledged (committed, then the power went before the
ack was written: allowed). `tally_ok` (1/0) says whether the tally row equals the number of
transactions in the table (a commit is all or nothing), `integrity_ok` (1/0) whether
integrity_check said ok (`integrity` is its text). The last stdout line is a JSON object
with these numbers; the exit status is 0 only if nothing acknowledged is lost or corrupt and
integrity_check said ok.
"""
import argparse
import hashlib
import json
import os
import sqlite3
import sys

VALUE_BYTES = 512


def value(n, i):
    """The content of row (n, i): a different 512-byte value for every row."""
    seed = hashlib.sha256(f"{n}:{i}".encode()).digest()
    return (seed * (VALUE_BYTES // len(seed) + 1))[:VALUE_BYTES]


def env(name):
    v = os.environ.get(name)
    if not v:
        sys.exit(f"sqlite.py: ${name} is not set (faultline sets it for a command stack with `acks: true`)")
    return v


def db_path():
    return os.path.join(env("FAULTLINE_MOUNT"), "app.db")


def write(args):
    acks = os.open(env("FAULTLINE_ACKS"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    # isolation_level=None: no implicit transactions, BEGIN/COMMIT are ours
    db = sqlite3.connect(db_path(), isolation_level=None)
    mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode != "wal":
        sys.exit(f"sqlite.py: journal_mode is {mode}, not wal")
    db.execute(f"PRAGMA synchronous={args.sync.upper()}")
    db.execute("CREATE TABLE IF NOT EXISTS rows (txn INTEGER, i INTEGER, v BLOB, PRIMARY KEY (txn, i))")
    db.execute("CREATE TABLE IF NOT EXISTS tally (id INTEGER PRIMARY KEY, n INTEGER)")
    db.execute("INSERT OR IGNORE INTO tally VALUES (1, 0)")
    start = (db.execute("SELECT max(txn) FROM rows").fetchone()[0] or 0) + 1
    print(f"sqlite.py: WAL, synchronous={args.sync}, {args.rows} rows per transaction, from {start}", flush=True)
    n = start
    while args.max is None or n < start + args.max:
        db.execute("BEGIN")
        db.executemany("INSERT INTO rows VALUES (?, ?, ?)", [(n, i, value(n, i)) for i in range(args.rows)])
        db.execute("UPDATE tally SET n = n + 1 WHERE id = 1")
        db.execute("COMMIT")
        # the commit returned: only now is it acknowledged
        os.write(acks, f"{n}\n".encode())
        n += 1
    db.close()


def check(args):
    try:
        with open(env("FAULTLINE_ACKS")) as f:
            acked = [int(line) for line in f if line.strip()]
    except FileNotFoundError:
        acked = []
    out = {"acked": len(acked), "present": 0, "lost": 0, "corrupt": 0, "extra": 0, "integrity": "ok", "tally_ok": False}
    path = db_path()
    try:
        if not os.path.exists(path):
            raise sqlite3.DatabaseError(f"{path} does not exist")
        db = sqlite3.connect(path, isolation_level=None)
        res = [r[0] for r in db.execute("PRAGMA integrity_check")]
        if res != ["ok"]:
            out["integrity"] = "; ".join(res[:3]) + (f" (+{len(res) - 3} more)" if len(res) > 3 else "")
        found = {}
        for txn, i, v in db.execute("SELECT txn, i, v FROM rows"):
            found.setdefault(txn, {})[i] = v
        tally = db.execute("SELECT n FROM tally WHERE id = 1").fetchone()
        out["tally_ok"] = tally is not None and tally[0] == len(found)
        db.close()
    except sqlite3.DatabaseError as e:
        out["integrity"] = f"error: {e}"
        found = {}
    def whole(n, rows):
        return len(rows) == args.rows and all(rows.get(i) == value(n, i) for i in range(args.rows))

    for n in acked:
        rows = found.get(n)
        if rows is None:
            out["lost"] += 1
        elif whole(n, rows):
            out["present"] += 1
        else:
            out["corrupt"] += 1
    ackset = set(acked)
    for n, rows in found.items():
        if n not in ackset:
            # a partly present unacknowledged transaction breaks atomicity as well
            if whole(n, rows):
                out["extra"] += 1
            else:
                out["corrupt"] += 1
    ok = out["lost"] == 0 and out["corrupt"] == 0 and out["integrity"] == "ok" and out["tally_ok"]
    # flags as 0/1 too: the run records the line's numbers
    out["integrity_ok"] = int(out["integrity"] == "ok")
    out["tally_ok"] = int(out["tally_ok"])
    print(json.dumps(out), flush=True)
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description="SQLite crash recipe (see the module docstring)")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--sync", choices=["full", "normal", "off", "extra"], required=True)
    w.add_argument("--rows", type=int, default=4)
    w.add_argument("--max", type=int, default=None, help="stop after this many transactions (default: until killed)")
    c = sub.add_parser("check")
    c.add_argument("--rows", type=int, default=4)
    a = p.parse_args()
    if a.cmd == "write":
        write(a)
        return 0
    return check(a)


if __name__ == "__main__":
    sys.exit(main())
