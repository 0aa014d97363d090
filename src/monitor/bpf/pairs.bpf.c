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
#include "win.bpf.h"

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

// Per window (`baseline: windows`, win.bpf.h), key window << 32 | sum index: an event counts in
// the window its time (the commit's end for jbd2_run_stats) falls in.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, u64);
	__type(value, struct sum_val);
} wsums SEC(".maps");

// The driver layer's FUSE requests on BTF-typed or raw tracepoints (where they load): the
// request's own fields through its pointer, no event record built; the start time kept in an
// array slot picked by the request's unique id (the kernel hands them out in steps of 2, so
// slots are reused only after FUSE_SLOTS more requests: no hash, no lock), checked at the end
// against the id and connection; histograms per CPU by opcode (plain adds). The classic pair
// above is the fallback.
const volatile u32 fuse_nconns = 0;
const volatile u32 fuse_conns[MAX_FUSE_CONNS] = {};

struct fuse_start {
	u64 unique;
	u32 conn;
	u32 pad;
	u64 ts;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FUSE_SLOTS);
	__type(key, u32);
	__type(value, struct fuse_start);
} fuse_starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FUSE_NCLASS);
	__type(key, u32);
	__type(value, struct hist);
} fuse_hists SEC(".maps");

// [0]: ends whose send was not seen (sent before attach, or its slot reused meanwhile)
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} fuse_stats SEC(".maps");

static __always_inline int fuse_watched(u32 conn)
{
#pragma unroll
	for (int i = 0; i < MAX_FUSE_CONNS; i++) {
		if (i >= fuse_nconns)
			break;
		if (fuse_conns[i] == conn)
			return 1;
	}
	return 0;
}

/* The start slot of a watched connection's request (NULL when not watched). */
static __always_inline struct fuse_start *fuse_slot(u32 conn, u64 unique)
{
	if (!fuse_watched(conn))
		return NULL;
	u32 k = (unique >> 1) & (FUSE_SLOTS - 1);
	return bpf_map_lookup_elem(&fuse_starts, &k);
}

static __always_inline void fuse_send(u32 conn, u64 unique)
{
	struct fuse_start *st = fuse_slot(conn, unique);
	if (!st)
		return;
	st->unique = unique;
	st->conn = conn;
	st->ts = bpf_ktime_get_ns();
}

static __always_inline void fuse_end(u32 conn, u64 unique, u32 opcode)
{
	struct fuse_start *st = fuse_slot(conn, unique);
	if (!st)
		return;
	u64 t = st->ts;
	if (!t || st->unique != unique || st->conn != conn) {
		u32 z = 0;
		u64 *v = bpf_map_lookup_elem(&fuse_stats, &z);
		if (v)
			(*v)++;
		return;
	}
	st->ts = 0;
	u64 now = bpf_ktime_get_ns();
	u64 ns = now > t ? now - t : 0;
	u32 c = opcode < FUSE_NCLASS ? opcode : FUSE_NCLASS - 1;
	struct hist *h = bpf_map_lookup_elem(&fuse_hists, &c);
	if (h)
		hist_add_cpu(h, ns, 0);
	// per window after the classic pairs' histograms
	if (now > t)
		win_add(MAX_PAIR_HISTS + c, t, now, 0);
}

SEC("tp_btf/fuse_request_send")
int BPF_PROG(btf_fuse_send, const struct fuse_req *req)
{
	fuse_send(req->fm->fc->dev, req->in.h.unique);
	return 0;
}

SEC("tp_btf/fuse_request_end")
int BPF_PROG(btf_fuse_end, const struct fuse_req *req)
{
	fuse_end(req->fm->fc->dev, req->in.h.unique, req->in.h.opcode);
	return 0;
}

SEC("raw_tp/fuse_request_send")
int BPF_PROG(raw_fuse_send, const struct fuse_req *req)
{
	fuse_send(BPF_CORE_READ(req, fm, fc, dev), BPF_CORE_READ(req, in.h.unique));
	return 0;
}

SEC("raw_tp/fuse_request_end")
int BPF_PROG(raw_fuse_end, const struct fuse_req *req)
{
	fuse_end(BPF_CORE_READ(req, fm, fc, dev), BPF_CORE_READ(req, in.h.unique), BPF_CORE_READ(req, in.h.opcode));
	return 0;
}

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
	u64 ts = v->ts;
	u64 ns = now - ts;
	u32 class = v->class;
	bpf_map_delete_elem(&starts, &k);
	if (class >= p->nclass)
		class = p->nclass ? p->nclass - 1 : 0;
	u32 hi = p->hist_base + class;
	struct hist *h = bpf_map_lookup_elem(&phists, &hi);
	if (!h)
		return;
	hist_add_shared(h, ns, 0);
	if (now >= ts)
		win_add(hi, ts, now, 0);
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
	struct sum_val *w = NULL;
	if (win_n) {
		u64 now = bpf_ktime_get_ns();
		int k = window_of(now, now);
		if (k >= 0) {
			u64 key = ((u64)k << 32) | i;
			w = bpf_map_lookup_elem(&wsums, &key);
			if (!w) {
				struct sum_val zero = {};
				bpf_map_update_elem(&wsums, &key, &zero, BPF_NOEXIST);
				w = bpf_map_lookup_elem(&wsums, &key);
				u32 z = 0;
				u64 *lost = w ? NULL : bpf_map_lookup_elem(&win_lost, &z);
				if (lost)
					__sync_fetch_and_add(lost, 1);
			}
		}
	}
	__sync_fetch_and_add(&s->count, 1);
	if (w)
		__sync_fetch_and_add(&w->count, 1);
	u32 n = c->nfields;
#pragma unroll
	for (int f = 0; f < SUM_FIELDS; f++) {
		if (f >= n)
			break;
		u64 v = field(ctx, c->off[f], c->size[f]);
		__sync_fetch_and_add(&s->sum[f], v);
		if (v > s->max[f])
			s->max[f] = v; // racy max: summed events are rare (one per journal commit)
		if (w) {
			__sync_fetch_and_add(&w->sum[f], v);
			if (v > w->max[f])
				w->max[f] = v;
		}
	}
	return 0;
}
