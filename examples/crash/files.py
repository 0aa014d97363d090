#!/usr/bin/env python3
"""File crash recipe: files made durable the POSIX way, acknowledged, and checked after the
power cut (what a file system mounted with or without barriers keeps of fsynced files).

  files.py write [--max N]
  files.py check

Both use $FAULTLINE_MOUNT (the file system on the faulty disk; files go to
$FAULTLINE_MOUNT/files) and $FAULTLINE_ACKS (a file outside that disk).

write: file n (4 KiB to 64 KiB of content that is a function of n) is written to
files/n.tmp, fsync()ed, renamed to files/n, and the directory is fsync()ed: the rename and
the content are then durable by POSIX and by ext4's promise. Only then the line "n" is
appended to the acks file (one write(2) to an O_APPEND file). Loops until it is killed (or N
files).

check: every acknowledged file must exist with its exact content: `present`, `lost` (no such
file), `corrupt` (wrong size or content). `extra` counts whole files that were never
acknowledged (allowed), `partial` leftover .tmp files or unacknowledged files with wrong
content (allowed: never promised). The last stdout line is a JSON object with these numbers;
the exit status is 0 only if nothing acknowledged is lost or corrupt.
"""
import argparse
import hashlib
import json
import os
import sys


def content(n):
    """The content of file n: 4 KiB to 64 KiB, different for every file."""
    size = 4096 * (1 + n % 16)
    seed = hashlib.sha256(str(n).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def env(name):
    v = os.environ.get(name)
    if not v:
        sys.exit(f"files.py: ${name} is not set (faultline sets it for a command stack with `acks: true`)")
    return v


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(args):
    acks = os.open(env("FAULTLINE_ACKS"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    mnt = env("FAULTLINE_MOUNT")
    d = os.path.join(mnt, "files")
    os.makedirs(d, exist_ok=True)
    fsync_dir(d)
    fsync_dir(mnt)  # the directory's own entry
    print("files.py: write, fsync, rename, fsync the directory; one ack per file", flush=True)
    n = 1
    while args.max is None or n <= args.max:
        tmp = os.path.join(d, f"{n}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, content(n))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(d, str(n)))
        fsync_dir(d)
        # durable by every rule the file system promises: only now acknowledged
        os.write(acks, f"{n}\n".encode())
        n += 1


def check(_args):
    try:
        with open(env("FAULTLINE_ACKS")) as f:
            acked = [int(line) for line in f if line.strip()]
    except FileNotFoundError:
        acked = []
    d = os.path.join(env("FAULTLINE_MOUNT"), "files")
    out = {"acked": len(acked), "present": 0, "lost": 0, "corrupt": 0, "extra": 0, "partial": 0, "dir_unreadable": 0}
    # a directory the cut damaged may not list (EIO, EUCLEAN): its files count as lost
    try:
        names = set(os.listdir(d)) if os.path.isdir(d) else set()
    except OSError:
        names, out["dir_unreadable"] = set(), 1

    def whole(n):
        try:
            with open(os.path.join(d, str(n)), "rb") as f:
                return f.read() == content(n)
        except OSError:
            return False

    for n in acked:
        if str(n) not in names:
            out["lost"] += 1
        elif whole(n):
            out["present"] += 1
        else:
            out["corrupt"] += 1
    ackset = {str(n) for n in acked}
    for name in names - ackset:
        if name.isdigit() and whole(int(name)):
            out["extra"] += 1
        else:
            out["partial"] += 1
    print(json.dumps(out), flush=True)
    return 0 if out["lost"] == 0 and out["corrupt"] == 0 else 1


def main():
    p = argparse.ArgumentParser(description="file crash recipe (see the module docstring)")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--max", type=int, default=None, help="stop after this many files (default: until killed)")
    sub.add_parser("check")
    a = p.parse_args()
    if a.cmd == "write":
        write(a)
        return 0
    return check(a)


if __name__ == "__main__":
    sys.exit(main())
