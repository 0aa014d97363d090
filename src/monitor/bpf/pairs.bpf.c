// SPDX-License-Identifier: GPL-2.0
// Generic tracepoint pairs for faultline's monitor (loader: src/monitor/pairs.rs): the time
// from an "enter" event to the matching "exit" event, per pair, in the block layer's
// log-linear histograms. The same two programs serve every pair: each is attached to classic
// (tracefs) tracepoints once per event, with a BPF cookie naming the attachment, whose
// configuration (set from user space, from the events' format files) says which pairs it
// serves and where the event keeps their key, device and class. A third program adds up
// fields of an event (jbd2_run_stats). Nothing is recompiled for a new pair.
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "pairs.h"
#include "hist.bpf.h"

char LICENSE[] SEC("license") = "GPL";

// The kernel's tick rate, for summed fields in jiffies: libbpf resolves it at load from the
// kernel's build configuration (/boot/config-$(uname -r) or /proc/config.gz); 0 if neither.
extern unsigned int CONFIG_HZ __kconfig __weak;
// Copied here by field_sum so user space can read it.
u64 kconfig_hz = 0;

// Attachment id (the cookie) -> its pairs.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_ATTACH);
	__type(key, u32);
	__type(value, struct att_cfg);
} atts SEC(".maps");

// Watched devices (kernel dev_t, major << 20 | minor); events with a device field are
// counted only for these.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PAIR_DEVS);
	__type(key, u32);
	__type(value, u8);
} pdevs SEC(".maps");

// Watched processes (tgid) and threads (tid), for pairs with tgid_filter.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, u8);
} ptasks SEC(".maps");

// Starts in progress. LRU: an enter whose exit never comes (an error path without the exit
// event) must not fill the table.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct skey);
	__type(value, struct sval);
} starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PAIR_HISTS);
	__type(key, u32);
	__type(value, struct hist);
} phists SEC(".maps");

// Per pair.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_ATTACH);
	__type(key, u32);
	__type(value, struct pair_stat);
} pstats SEC(".maps");

// Summed events: cookie - MAX_ATTACH -> config, sums.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SUMS);
	__type(key, u32);
	__type(value, struct sum_cfg);
} sumcfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SUMS);
	__type(key, u32);
	__type(value, struct sum_val);
} sums SEC(".maps");

// A field of the event record (offset and size from its format file), zero-extended.
static __always_inline u64 field(void *ctx, u16 off, u16 size)
{
	u64 v = 0;
	u32 n = size;
	if (n > 8)
		n = 8;
	if (n == 0)
		return 0;
	bpf_probe_read_kernel(&v, n, (char *)ctx + off);
	return v;
}

static __always_inline void one(void *ctx, struct att_pair *p, int exit, u64 now, u64 pid_tgid)
{
	u32 dev = 0;
	if (p->dev_off) {
		dev = field(ctx, p->dev_off, 4);
		if (!bpf_map_lookup_elem(&pdevs, &dev))
			return;
	}
	if (p->tgid_filter) {
		u32 tgid = pid_tgid >> 32, tid = (u32)pid_tgid;
		if (!bpf_map_lookup_elem(&ptasks, &tgid) && !bpf_map_lookup_elem(&ptasks, &tid))
			return;
	}
	struct skey k = { .pair = p->pair };
	k.key = p->key_size ? field(ctx, p->key_off, p->key_size) : (u32)pid_tgid;
	if (p->key_dev)
		k.key = (k.key & 0xffffffffULL) | ((u64)dev << 32);
	u32 pair = p->pair;
	if (!exit) {
		struct sval v = { .ts = now };
		if (p->class_size)
			v.class = field(ctx, p->class_off, p->class_size);
		if (bpf_map_update_elem(&starts, &k, &v, BPF_ANY)) {
			struct pair_stat *ps = bpf_map_lookup_elem(&pstats, &pair);
			if (ps)
				__sync_fetch_and_add(&ps->untracked, 1);
		}
		return;
	}
	struct sval *v = bpf_map_lookup_elem(&starts, &k);
	if (!v) {
		struct pair_stat *ps = bpf_map_lookup_elem(&pstats, &pair);
		if (ps)
			__sync_fetch_and_add(&ps->unmatched, 1);
		return;
	}
	u64 ns = now - v->ts;
	u32 class = v->class;
	bpf_map_delete_elem(&starts, &k);
	if (class >= p->nclass)
		class = p->nclass ? p->nclass - 1 : 0;
	u32 hi = p->hist_base + class;
	struct hist *h = bpf_map_lookup_elem(&phists, &hi);
	if (!h)
		return;
	hist_add_shared(h, ns, 0);
}

static __always_inline int on_event(void *ctx, int exit)
{
	u32 a = bpf_get_attach_cookie(ctx);
	struct att_cfg *ac = bpf_map_lookup_elem(&atts, &a);
	if (!ac)
		return 0;
	u64 now = bpf_ktime_get_ns(), pid_tgid = bpf_get_current_pid_tgid();
	u32 n = ac->npairs;
#pragma unroll
	for (int i = 0; i < PAIRS_PER_ATTACH; i++) {
		if (i >= n)
			break;
		one(ctx, &ac->p[i], exit, now, pid_tgid);
	}
	return 0;
}

SEC("tracepoint")
int pair_enter(void *ctx) { return on_event(ctx, 0); }

SEC("tracepoint")
int pair_exit(void *ctx) { return on_event(ctx, 1); }

SEC("tracepoint")
int field_sum(void *ctx)
{
	u32 i = bpf_get_attach_cookie(ctx);
	struct sum_cfg *c = bpf_map_lookup_elem(&sumcfg, &i);
	struct sum_val *s = bpf_map_lookup_elem(&sums, &i);
	if (!c || !s)
		return 0;
	if (c->dev_off) {
		u32 dev = field(ctx, c->dev_off, 4);
		if (!bpf_map_lookup_elem(&pdevs, &dev))
			return 0;
	}
	kconfig_hz = CONFIG_HZ;
	__sync_fetch_and_add(&s->count, 1);
	u32 n = c->nfields;
#pragma unroll
	for (int f = 0; f < SUM_FIELDS; f++) {
		if (f >= n)
			break;
		u64 v = field(ctx, c->off[f], c->size[f]);
		__sync_fetch_and_add(&s->sum[f], v);
		if (v > s->max[f])
			s->max[f] = v; // racy max: summed events are rare (one per journal commit)
	}
	return 0;
}
