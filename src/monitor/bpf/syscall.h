// Shared by syscall.bpf.c and src/monitor/syscall.rs.
#ifndef FAULTLINE_SYSCALL_H
#define FAULTLINE_SYSCALL_H

#include "block.h" // struct hist, NR_BUCKETS

#define NR_SYS_OPS 10 // read, write, fsync, open, fallocate, io_uring_enter, close, unlink, rename, stat
#define MAX_SYSCALL_NR 512

struct sysop_stat {
	u64 errors; // calls that returned a negative errno
};

#endif
