// SPDX-License-Identifier: GPL-2.0
// Block-layer timing for faultline's monitor (loader: src/monitor/block.rs).
//
// One program per request, at its completion: the kernel already stamps each request with
// when it was allocated (start_time_ns, set when the queue keeps I/O statistics) and when the
// driver was handed it (io_start_time_ns, set when the queue keeps blk-stat statistics, which
// writeback throttling turns on), so queue time = io_start - start and service time = now -
// io_start, added to per-CPU log-linear histograms per device x layer x op and per-interval
// counters. User space only reads the maps (and samples the queue depth from sysfs).
//
// Where a device's requests carry no issue time, the loader also attaches an issue program
// that stores it in a table. Three flavours of the same bodies: tp_btf (BTF-typed arguments,
// plain loads), raw_tp (reads through BPF_CORE_READ) and classic tracepoints (no request
// address: issue and completion matched by device and sector; no queue time).
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "block.h"
#include "hist.bpf.h"
#include "win.bpf.h"

char LICENSE[] SEC("license") = "GPL";

// Set by the loader before load.
const volatile u64 interval_ns = 1000000000ULL;
const volatile u64 t0_ns = 0;
const volatile u32 ndevs = 0;
// Watched devices, kernel dev_t (major << 20 | minor); the index is the device's slot below.
const volatile u32 devts[MAX_DEVS] = {};

// Histograms, index ((dev * NR_LAYERS) + layer) * NR_OPS + op; per CPU, so plain adds (the
// loader sizes it for the watched devices only).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_DEVS * NR_LAYERS * NR_OPS);
	__type(key, u32);
	__type(value, struct hist);
} hists SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_DEVS);
	__type(key, u32);
	__type(value, struct devstat);
} devstats SEC(".maps");

// Per-interval counters, index dev * NR_SLOTS + (interval % NR_SLOTS), per CPU. Only ever
// added to here; user space reads a finished interval's slot and zeroes it for reuse.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_DEVS * NR_SLOTS);
	__type(key, u32);
	__type(value, struct slot);
} slots SEC(".maps");

// Issue times stored by the issue programs (only attached where the kernel does not stamp
// requests), by request address. LRU: a request freed without completion must not fill it.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u64);
	__type(value, u64);
} issued SEC(".maps");

// The same for the classic tracepoints, by (device, sector).
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct rqkey);
	__type(value, u64);
} issued_at SEC(".maps");

// The watched device's index, or -1: compares against read-only data (no map lookup), so
// the requests of other devices cost a few loads.
static __always_inline int dev_slot(u32 devt)
{
#pragma unroll
	for (int i = 0; i < MAX_DEVS; i++) {
		if (i >= ndevs)
			break;
		if (devts[i] == devt)
			return i;
	}
	return -1;
}

static __always_inline u32 op_of(u32 cmd_flags)
{
	switch (cmd_flags & 0xff) { // REQ_OP_MASK
	case 0: return OP_READ;
	case 1: return OP_WRITE;
	case 2: return OP_FLUSH;
	case 3: return OP_DISCARD;
	default: return OP_OTHER;
	}
}

static __always_inline void devstat_add(int d, int field)
{
	u32 k = d;
	struct devstat *ds = bpf_map_lookup_elem(&devstats, &k);
	if (!ds)
		return;
	if (field == 0)
		ds->noissue++;
	else if (field == 1)
		ds->untracked++;
	else if (field == 2)
		ds->partial++;
	else if (field == 3)
		ds->early++;
	else if (field == 4)
		ds->backwards++;
	else if (field == 5)
		ds->seen++;
	else
		ds->dataless++;
}

// One completed request: `issue_ns` 0 when its issue time is unknown, `start_ns` 0 when its
// queueing start is unknown. `whole` 0 for a partial completion (more to come).
static __always_inline void account(int d, u32 op, u64 bytes, u64 start_ns, u64 issue_ns, int whole)
{
	if (d < 0 || d >= MAX_DEVS || op >= NR_OPS)
		return;
	devstat_add(d, 5);
	// a data write with a preflush is completed twice: its data, then (bytes used up) the
	// end of its flush sequence
	if (!bytes && (op == OP_READ || op == OP_WRITE)) {
		devstat_add(d, 6);
		return;
	}
	if (!whole) {
		devstat_add(d, 2);
		return;
	}
	if (!issue_ns) {
		if (bytes)
			devstat_add(d, 0); // not issued (a flush's data-less parent) or not stamped
		return;
	}
	if (issue_ns < t0_ns) {
		devstat_add(d, 3); // issued before the monitor started: its other layers did not see it either
		return;
	}
	// bpf_ktime_get_ns is the NMI-safe fast clock, the stamp ktime_get_ns: the fast clock
	// can read behind it (a timekeeping update in between); such a request is still counted
	u64 now = bpf_ktime_get_ns();
	if (now < issue_ns) {
		devstat_add(d, 4);
		now = issue_ns;
	}
	u64 svc = now - issue_ns, q = 0;
	int have_q = start_ns && start_ns <= issue_ns;
	if (have_q)
		q = issue_ns - start_ns;
	u32 key = ((u32)d * NR_LAYERS + LAYER_SERVICE) * NR_OPS + op;
	struct hist *h = bpf_map_lookup_elem(&hists, &key);
	if (h)
		hist_add_cpu(h, svc, bytes);
	if (have_q) {
		key = ((u32)d * NR_LAYERS + LAYER_QUEUE) * NR_OPS + op;
		h = bpf_map_lookup_elem(&hists, &key);
		if (h)
			hist_add_cpu(h, q, 0);
	}
	// `baseline: windows`: each part in the window that holds it, from its start to its end
	win_add(((u32)d * NR_LAYERS + LAYER_SERVICE) * NR_OPS + op, issue_ns, now, bytes);
	if (have_q)
		win_add(((u32)d * NR_LAYERS + LAYER_QUEUE) * NR_OPS + op, start_ns, issue_ns, 0);
	if (now < t0_ns || !interval_ns)
		return;
	u64 epoch = (now - t0_ns) / interval_ns;
	key = (u32)d * NR_SLOTS + (u32)(epoch % NR_SLOTS);
	struct slot *s = bpf_map_lookup_elem(&slots, &key);
	if (!s)
		return;
	if (s->epoch != epoch + 1) {
		// this CPU's copy still holds an older interval (user space zeroes what it read,
		// but may not have read this CPU's yet): start it over, so intervals never mix
		__builtin_memset(s, 0, sizeof(*s));
		s->epoch = epoch + 1; // 1-based: 0 marks a slot never written
	}
	s->count[op]++;
	s->bytes[op] += bytes;
	s->service_ns[op] += svc;
	if (have_q) {
		s->queued[op]++;
		s->queue_ns[op] += q;
	}
}

// The issue time, from the request or (fallback) from the issue table.
static __always_inline u64 issue_time(u64 stamped, u64 rq)
{
	if (stamped)
		return stamped;
	u64 *t = bpf_map_lookup_elem(&issued, &rq);
	if (!t)
		return 0;
	u64 v = *t;
	bpf_map_delete_elem(&issued, &rq);
	return v;
}

static __always_inline void store_issue(int d, u64 rq)
{
	u64 now = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&issued, &rq, &now, BPF_ANY))
		devstat_add(d, 1);
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(btf_rq_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	struct gendisk *disk = rq->q->disk;
	if (!disk)
		return 0;
	int d = dev_slot(((u32)disk->major << 20) | (u32)disk->first_minor);
	if (d < 0)
		return 0;
	u32 len = rq->__data_len;
	account(d, op_of(rq->cmd_flags), nr_bytes, rq->start_time_ns, issue_time(rq->io_start_time_ns, (u64)rq), nr_bytes >= len);
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(btf_rq_issue, struct request *rq)
{
	struct gendisk *disk = rq->q->disk;
	if (!disk)
		return 0;
	int d = dev_slot(((u32)disk->major << 20) | (u32)disk->first_minor);
	if (d >= 0)
		store_issue(d, (u64)rq);
	return 0;
}

SEC("raw_tp/block_rq_complete")
int BPF_PROG(raw_rq_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	struct gendisk *disk = BPF_CORE_READ(rq, q, disk);
	if (!disk)
		return 0;
	int d = dev_slot(((u32)BPF_CORE_READ(disk, major) << 20) | (u32)BPF_CORE_READ(disk, first_minor));
	if (d < 0)
		return 0;
	u32 len = BPF_CORE_READ(rq, __data_len);
	u64 issue = issue_time(BPF_CORE_READ(rq, io_start_time_ns), (u64)rq);
	account(d, op_of(BPF_CORE_READ(rq, cmd_flags)), nr_bytes, BPF_CORE_READ(rq, start_time_ns), issue, nr_bytes >= len);
	return 0;
}

SEC("raw_tp/block_rq_issue")
int BPF_PROG(raw_rq_issue, struct request *rq)
{
	struct gendisk *disk = BPF_CORE_READ(rq, q, disk);
	if (!disk)
		return 0;
	int d = dev_slot(((u32)BPF_CORE_READ(disk, major) << 20) | (u32)BPF_CORE_READ(disk, first_minor));
	if (d >= 0)
		store_issue(d, (u64)rq);
	return 0;
}

// The op from the event's rwbs text: an optional leading F (preflush), then the op letter.
static __always_inline u32 op_of_rwbs(const char *rwbs)
{
	char c = rwbs[0];
	if (c == 'F' && (rwbs[1] == 'W' || rwbs[1] == 'R' || rwbs[1] == 'D' || rwbs[1] == 'N' || rwbs[1] == 'F'))
		c = rwbs[1];
	switch (c) {
	case 'R': return OP_READ;
	case 'W': return OP_WRITE;
	case 'F': return OP_FLUSH;
	case 'D': return OP_DISCARD;
	default: return OP_OTHER;
	}
}

SEC("tracepoint/block/block_rq_issue")
int tp_rq_issue(struct trace_event_raw_block_rq *ctx)
{
	u32 dev = ctx->dev;
	int d = dev_slot(dev);
	if (d < 0)
		return 0;
	struct rqkey k = { .dev = dev, .sector = ctx->sector };
	u64 now = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&issued_at, &k, &now, BPF_ANY))
		devstat_add(d, 1);
	return 0;
}

SEC("tracepoint/block/block_rq_complete")
int tp_rq_complete(struct trace_event_raw_block_rq_completion *ctx)
{
	u32 dev = ctx->dev;
	int d = dev_slot(dev);
	if (d < 0)
		return 0;
	struct rqkey k = { .dev = dev, .sector = ctx->sector };
	char rwbs[4] = {};
	bpf_probe_read_kernel(rwbs, sizeof(rwbs), ctx->rwbs);
	u64 bytes = (u64)ctx->nr_sector << 9;
	u64 *t = bpf_map_lookup_elem(&issued_at, &k);
	u64 issue = t ? *t : 0;
	if (t)
		bpf_map_delete_elem(&issued_at, &k);
	// the event has no remaining length: each event is counted as a whole request
	account(d, op_of_rwbs(rwbs), bytes, 0, issue, 1);
	return 0;
}

// Tests only (src/monitor/window.rs): the window an interval [start, end] counts for, + 1 (0:
// none), by the code every program above uses. Run with BPF_PROG_RUN, never attached; loaded
// only by that test.
struct win_probe_args {
	u64 start;
	u64 end;
};

SEC("syscall")
int win_probe(struct win_probe_args *a)
{
	return window_of(a->start, a->end) + 1;
}
