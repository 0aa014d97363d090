/* The I/O that scripts/record-dm-log-writes.sh runs on a dm-log-writes target inside its
 * virtual machine: the operations of an ops file (tests/fixtures/dm-log-writes/ops-*), one a
 * line, in order, each reported on stdout. Built statically: the machine has no libc of its own.
 *   dm-log-writes-io DEVICE DM_NAME OPS_FILE
 * Operations (offsets and lengths in bytes):
 *   write OFF LEN    pwrite with O_DIRECT
 *   fua OFF LEN      pwrite with O_DIRECT|O_DSYNC (the kernel sends REQ_FUA, then a flush)
 *   flush            fsync: an empty REQ_PREFLUSH bio
 *   discard OFF LEN  ioctl BLKDISCARD
 *   mark NAME        dmsetup message DM_NAME 0 mark NAME
 * The Nth write or fua (from 1) fills each 512 B sector S it covers with 16 records of 32 bytes:
 * "write N sector S" left-aligned in 31 bytes, then a newline; the test recomputes them. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what, int line) {
    fprintf(stderr, "dm-log-writes-io: ops line %d: %s: %s\n", line, what, strerror(errno));
    exit(1);
}

static void fill(char *buf, unsigned long long off, unsigned long long len, unsigned n) {
    for (unsigned long long at = 0; at < len; at += 32) {
        char text[48], rec[48];
        snprintf(text, sizeof text, "write %u sector %llu", n, (off + at) / 512);
        snprintf(rec, sizeof rec, "%-31.31s\n", text);
        memcpy(buf + at, rec, 32);
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: dm-log-writes-io DEVICE DM_NAME OPS_FILE\n");
        return 2;
    }
    FILE *ops = fopen(argv[3], "r");
    int fd = open(argv[1], O_WRONLY | O_DIRECT);
    int fua = open(argv[1], O_WRONLY | O_DIRECT | O_DSYNC);
    if (!ops || fd < 0 || fua < 0) die("open", 0);
    char line[256], op[32], arg[200];
    unsigned long long off, len;
    unsigned writes = 0;
    for (int ln = 1; fgets(line, sizeof line, ops); ln++) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        int k = sscanf(line, "%31s %199s %llu", op, arg, &len);
        if (k <= 0) continue;
        printf("op %d: %s", ln, line);
        fflush(stdout);
        if ((!strcmp(op, "write") || !strcmp(op, "fua")) && k == 3) {
            off = strtoull(arg, NULL, 0);
            char *buf;
            if (posix_memalign((void **)&buf, 4096, len)) die("memalign", ln);
            fill(buf, off, len, ++writes);
            int f = strcmp(op, "fua") ? fd : fua;
            if (pwrite(f, buf, len, off) != (ssize_t)len) die("pwrite", ln);
            free(buf);
        } else if (!strcmp(op, "flush") && k == 1) {
            if (fsync(fd)) die("fsync", ln);
        } else if (!strcmp(op, "discard") && k == 3) {
            uint64_t r[2] = {strtoull(arg, NULL, 0), len};
            if (ioctl(fd, BLKDISCARD, r)) die("BLKDISCARD", ln);
        } else if (!strcmp(op, "mark") && k == 2) {
            pid_t p = fork();
            if (p == 0) {
                execlp("dmsetup", "dmsetup", "message", argv[2], "0", "mark", arg, (char *)NULL);
                _exit(127);
            }
            int st;
            if (p < 0 || waitpid(p, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) die("dmsetup message", ln);
        } else {
            errno = EINVAL;
            die("expected write OFF LEN, fua OFF LEN, flush, discard OFF LEN or mark NAME", ln);
        }
    }
    return 0;
}
