// SPDX-License-Identifier: GPL-2.0
// Syscall-layer timing for faultline's monitor (loader: src/monitor/syscall.rs): the time
// from entry to exit of the I/O system calls of a set of processes (and the processes they
// fork after attach), in the same log-linear histograms as the block layer, per op. Which
// syscall number is which op is set from user space (the numbers differ between
// architectures), so nothing here is architecture-specific.
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "syscall.h"
#include "hist.bpf.h"
#include "win.bpf.h"

char LICENSE[] SEC("license") = "GPL";

// Watched processes (tgid -> 1); forks of a watched process are added.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, u8);
} tgids SEC(".maps");

// Syscall number -> op + 1 (0: not an I/O call we time).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SYSCALL_NR);
	__type(key, u32);
	__type(value, u32);
} sysops SEC(".maps");

struct call {
	u64 ts; // 0: no call of ours in progress
	u32 op;
	u32 pad;
};

// The call in progress, in the thread's own storage: a thread that never made a timed call has
// none, so the exit of every other system call on the machine costs one pointer test, not a
// hash lookup.
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct call);
} calls SEC(".maps");

// Per CPU: plain adds, summed by the loader.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NR_SYS_OPS);
	__type(key, u32);
	__type(value, struct hist);
} sys_hists SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NR_SYS_OPS);
	__type(key, u32);
	__type(value, struct sysop_stat);
} sys_stats SEC(".maps");

// A timed call's entry: the process test (a hash lookup), then the start in the thread's
// storage.
static __always_inline int enter_op(u32 op)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!bpf_map_lookup_elem(&tgids, &tgid))
		return 0;
	struct call *c = bpf_task_storage_get(&calls, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!c)
		return 0;
	c->op = op;
	c->ts = bpf_ktime_get_ns();
	return 0;
}

// raw_syscalls (the fallback): every system call of every process comes here, so the
// cheapest test first (the syscall number, an array read the verifier inlines).
static __always_inline int on_enter(long id)
{
	if (id < 0 || id >= MAX_SYSCALL_NR)
		return 0;
	u32 nr = id;
	u32 *op = bpf_map_lookup_elem(&sysops, &nr);
	if (!op || !*op)
		return 0;
	return enter_op(*op - 1);
}

static __always_inline int on_exit(long ret)
{
	struct call *c = bpf_task_storage_get(&calls, bpf_get_current_task_btf(), 0, 0);
	if (!c || !c->ts)
		return 0;
	u64 ts = c->ts, now = bpf_ktime_get_ns();
	u64 ns = now - ts;
	u32 op = c->op;
	c->ts = 0;
	struct hist *h = bpf_map_lookup_elem(&sys_hists, &op);
	if (!h)
		return 0;
	u64 bytes = ret > 0 && op <= 1 ? ret : 0; // read, write: bytes transferred
	hist_add_cpu(h, ns, bytes);
	win_add(op, ts, now, bytes);
	if (ret < 0) {
		struct sysop_stat *s = bpf_map_lookup_elem(&sys_stats, &op);
		if (s)
			s->errors++;
	}
	return 0;
}

static __always_inline int on_fork(struct task_struct *parent, struct task_struct *child)
{
	u32 ptgid = BPF_CORE_READ(parent, tgid);
	if (!bpf_map_lookup_elem(&tgids, &ptgid))
		return 0;
	u32 ctgid = BPF_CORE_READ(child, tgid);
	u8 one = 1;
	bpf_map_update_elem(&tgids, &ctgid, &one, BPF_ANY);
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(btf_sys_enter, struct pt_regs *regs, long id) { return on_enter(id); }
SEC("tp_btf/sys_exit")
int BPF_PROG(btf_sys_exit, struct pt_regs *regs, long ret) { return on_exit(ret); }
SEC("tp_btf/sched_process_fork")
int BPF_PROG(btf_fork, struct task_struct *parent, struct task_struct *child) { return on_fork(parent, child); }

SEC("raw_tp/sys_enter")
int BPF_PROG(raw_sys_enter, struct pt_regs *regs, long id) { return on_enter(id); }
SEC("raw_tp/sys_exit")
int BPF_PROG(raw_sys_exit, struct pt_regs *regs, long ret) { return on_exit(ret); }
SEC("raw_tp/sched_process_fork")
int BPF_PROG(raw_fork, struct task_struct *parent, struct task_struct *child) { return on_fork(parent, child); }

// Per-syscall tracepoints (syscalls:sys_enter_pread64, ...; the default): attached only to
// the calls timed, so the kernel runs nothing of ours for the others (it tests a bitmap). The
// attachment's cookie is the op. The exit events' `ret` is at the same offset as raw_syscalls'
// (after the common fields and the syscall number), so the exit reads it the same way.
SEC("tracepoint")
int sc_enter(void *ctx) { return enter_op(bpf_get_attach_cookie(ctx)); }
SEC("tracepoint")
int sc_exit(struct trace_event_raw_sys_exit *ctx) { return on_exit(ctx->ret); }

// Classic tracepoints, where neither BTF-typed nor raw tracepoints load.
SEC("tracepoint/raw_syscalls/sys_enter")
int tp_sys_enter(struct trace_event_raw_sys_enter *ctx) { return on_enter(ctx->id); }
SEC("tracepoint/raw_syscalls/sys_exit")
int tp_sys_exit(struct trace_event_raw_sys_exit *ctx) { return on_exit(ctx->ret); }
// Runs in the parent: its thread group is the current task's.
SEC("tracepoint/sched/sched_process_fork")
int tp_fork(struct trace_event_raw_sched_process_fork *ctx)
{
	u32 ptgid = bpf_get_current_pid_tgid() >> 32;
	if (!bpf_map_lookup_elem(&tgids, &ptgid))
		return 0;
	u32 child = ctx->child_pid; // a new process: its pid is its thread group's
	u8 one = 1;
	bpf_map_update_elem(&tgids, &child, &one, BPF_ANY);
	return 0;
}
