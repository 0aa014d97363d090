// SPDX-License-Identifier: GPL-2.0
// Block-layer timing for faultline's monitor (loader: src/monitor/block.rs).
//
// Per request of the watched devices: queue time (first bio queued, or the request inserted,
// until the driver is handed the request) and service time (issue until completion), in
// log-linear histograms per device x layer x op, plus request count and bytes per op, queue
// depth seen at each issue, and per-interval counters. Everything is aggregated here; user
// space only reads the maps. The same bodies serve tp_btf programs and their raw_tp fallback
// (the loader picks one set), so every kernel read goes through BPF_CORE_READ.
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "block.h"

char LICENSE[] SEC("license") = "GPL";

// Set by the loader before load.
const volatile u64 interval_ns = 1000000000ULL;
const volatile u64 t0_ns = 0;

// Watched devices: kernel dev_t (major << 20 | minor) -> index into the arrays below.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_DEVS);
	__type(key, u32);
	__type(value, u32);
} devs SEC(".maps");

// Requests in flight (and inserted, not yet issued), by request address. LRU: a request
// merged into another after its insertion is freed without an issue or a completion.
struct start {
	u64 queued_ns; // 0: unknown
	u64 issued_ns; // 0: not issued yet
	u32 bytes;
	u32 dev;
	u32 op;
	u32 requeued; // block_rq_requeue seen since the issue
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u64);
	__type(value, struct start);
} reqs SEC(".maps");

// When each bio of a watched device was queued, by bio address. LRU: a bio merged into a
// request as other than its first bio is never looked up again.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u64);
	__type(value, u64);
} bios SEC(".maps");

// Histograms, index ((dev * NR_LAYERS) + layer) * NR_OPS + op. Shared (not per CPU) so the
// memory does not grow with the CPU count; updated with atomic adds.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_DEVS * NR_LAYERS * NR_OPS);
	__type(key, u32);
	__type(value, struct hist);
} hists SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_DEVS);
	__type(key, u32);
	__type(value, struct devstat);
} devstats SEC(".maps");

// Per-interval counters, index dev * NR_SLOTS + (interval % NR_SLOTS). Only ever added to
// here; user space reads a finished interval's slot and zeroes it for reuse.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_DEVS * NR_SLOTS);
	__type(key, u32);
	__type(value, struct slot);
} slots SEC(".maps");

static __always_inline u32 log2_u64(u64 v)
{
	u32 r = 0;
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

// Log-linear bucket: exact below 2^SUB_BITS, then 2^SUB_BITS buckets per power of two.
static __always_inline u32 bucket_of(u64 v)
{
	if (v < (1 << SUB_BITS))
		return v;
	u32 e = log2_u64(v);
	u32 sub = (v >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
	u32 idx = ((e - SUB_BITS + 1) << SUB_BITS) + sub;
	return idx < NR_BUCKETS ? idx : NR_BUCKETS - 1;
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

static __always_inline u32 *dev_index(struct gendisk *disk)
{
	if (!disk)
		return 0;
	u32 major = BPF_CORE_READ(disk, major);
	u32 minor = BPF_CORE_READ(disk, first_minor);
	u32 devt = (major << 20) | minor;
	return bpf_map_lookup_elem(&devs, &devt);
}

static __always_inline void hist_add(u32 dev, u32 layer, u32 op, u64 ns, u64 bytes)
{
	u32 key = (dev * NR_LAYERS + layer) * NR_OPS + op;
	struct hist *h = bpf_map_lookup_elem(&hists, &key);
	if (!h)
		return;
	u32 b = bucket_of(ns);
	if (b >= NR_BUCKETS)
		return;
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, ns);
	__sync_fetch_and_add(&h->bytes, bytes);
	__sync_fetch_and_add(&h->buckets[b], 1);
}

static __always_inline struct slot *slot_now(u32 dev, u64 now)
{
	if (now < t0_ns || !interval_ns)
		return 0;
	u64 epoch = (now - t0_ns) / interval_ns;
	u32 key = dev * NR_SLOTS + (u32)(epoch % NR_SLOTS);
	struct slot *s = bpf_map_lookup_elem(&slots, &key);
	if (s && s->epoch != epoch + 1)
		s->epoch = epoch + 1; // 1-based: 0 marks a slot never written
	return s;
}

static __always_inline int on_bio_queue(struct bio *bio)
{
	struct block_device *bdev = BPF_CORE_READ(bio, bi_bdev);
	if (!bdev || !dev_index(BPF_CORE_READ(bdev, bd_disk)))
		return 0;
	u64 key = (u64)bio, now = bpf_ktime_get_ns();
	bpf_map_update_elem(&bios, &key, &now, BPF_ANY);
	return 0;
}

static __always_inline int on_rq_insert(struct request *rq)
{
	u32 *dev = dev_index(BPF_CORE_READ(rq, q, disk));
	if (!dev)
		return 0;
	u64 key = (u64)rq;
	struct start *old = bpf_map_lookup_elem(&reqs, &key);
	if (old && old->requeued)
		return 0; // inserted again after a requeue: still the request first issued
	struct start st = {};
	struct bio *bio = BPF_CORE_READ(rq, bio);
	u64 bkey = (u64)bio;
	u64 *bq = bio ? bpf_map_lookup_elem(&bios, &bkey) : 0;
	st.queued_ns = bq ? *bq : bpf_ktime_get_ns();
	if (bq)
		bpf_map_delete_elem(&bios, &bkey); // used: a later bio at this address is a new one
	st.dev = *dev;
	if (bpf_map_update_elem(&reqs, &key, &st, BPF_ANY)) {
		struct devstat *ds = bpf_map_lookup_elem(&devstats, dev);
		if (ds)
			__sync_fetch_and_add(&ds->untracked, 1);
	}
	return 0;
}

static __always_inline int on_rq_issue(struct request *rq)
{
	u32 *dev = dev_index(BPF_CORE_READ(rq, q, disk));
	if (!dev)
		return 0;
	u32 d = *dev;
	u64 now = bpf_ktime_get_ns(), key = (u64)rq;
	struct start st = {};
	struct devstat *ds = bpf_map_lookup_elem(&devstats, &d);
	if (!ds)
		return 0;
	struct start *old = bpf_map_lookup_elem(&reqs, &key);
	if (old && old->issued_ns) {
		if (old->requeued)
			return 0; // issued again after a requeue: keep the first issue, counted once
		// the request at this address was issued and its completion never reached us: it
		// is no longer in flight; this is a new request
		__sync_fetch_and_add(&ds->lost, 1);
		__sync_fetch_and_add(&ds->inflight, -1);
		old = 0;
	}
	if (old && old->queued_ns) {
		st.queued_ns = old->queued_ns;
	} else {
		struct bio *bio = BPF_CORE_READ(rq, bio);
		u64 bkey = (u64)bio;
		u64 *bq = bio ? bpf_map_lookup_elem(&bios, &bkey) : 0;
		if (bq) {
			st.queued_ns = *bq;
			bpf_map_delete_elem(&bios, &bkey);
		}
	}
	st.issued_ns = now;
	st.bytes = BPF_CORE_READ(rq, __data_len);
	st.op = op_of(BPF_CORE_READ(rq, cmd_flags));
	st.dev = d;
	if (bpf_map_update_elem(&reqs, &key, &st, BPF_ANY)) {
		__sync_fetch_and_add(&ds->untracked, 1);
		return 0;
	}
	u64 depth = __sync_fetch_and_add(&ds->inflight, 1) + 1;
	u32 db = depth < DEPTH_BUCKETS ? depth : DEPTH_BUCKETS - 1;
	__sync_fetch_and_add(&ds->depth[db], 1);
	struct slot *s = slot_now(d, now);
	if (s) {
		__sync_fetch_and_add(&s->issues, 1);
		__sync_fetch_and_add(&s->depth_sum, depth);
		if (depth > s->depth_max)
			s->depth_max = depth; // racy max: at worst one sample low
	}
	return 0;
}

static __always_inline int on_rq_complete(struct request *rq)
{
	u64 key = (u64)rq;
	struct start *st = bpf_map_lookup_elem(&reqs, &key);
	if (!st) {
		// not watched, issued before we started, or its issue event was not seen; data-less
		// ones (the parent of a flush, never issued itself) are not counted
		u32 *dev = dev_index(BPF_CORE_READ(rq, q, disk));
		struct devstat *ds = dev && BPF_CORE_READ(rq, __data_len) ? bpf_map_lookup_elem(&devstats, dev) : 0;
		if (ds)
			__sync_fetch_and_add(&ds->unmatched, 1);
		return 0;
	}
	if (!st->issued_ns)
		return 0; // ended without being issued (e.g. a data-less flush's parent request)
	u64 now = bpf_ktime_get_ns();
	u32 d = st->dev, op = st->op;
	u64 bytes = st->bytes, svc = now - st->issued_ns, q = 0;
	int have_q = st->queued_ns && st->queued_ns <= st->issued_ns;
	if (have_q)
		q = st->issued_ns - st->queued_ns;
	bpf_map_delete_elem(&reqs, &key);
	if (d >= MAX_DEVS || op >= NR_OPS)
		return 0;
	hist_add(d, LAYER_SERVICE, op, svc, bytes);
	if (have_q)
		hist_add(d, LAYER_QUEUE, op, q, 0);
	struct devstat *ds = bpf_map_lookup_elem(&devstats, &d);
	if (ds)
		__sync_fetch_and_add(&ds->inflight, -1);
	struct slot *s = slot_now(d, now);
	if (s) {
		__sync_fetch_and_add(&s->count[op], 1);
		__sync_fetch_and_add(&s->bytes[op], bytes);
		__sync_fetch_and_add(&s->service_ns[op], svc);
		if (have_q) {
			__sync_fetch_and_add(&s->queued[op], 1);
			__sync_fetch_and_add(&s->queue_ns[op], q);
		}
	}
	return 0;
}

static __always_inline int on_rq_requeue(struct request *rq)
{
	u64 key = (u64)rq;
	struct start *st = bpf_map_lookup_elem(&reqs, &key);
	if (st)
		st->requeued = 1;
	return 0;
}

SEC("tp_btf/block_bio_queue")
int BPF_PROG(btf_bio_queue, struct bio *bio) { return on_bio_queue(bio); }
SEC("tp_btf/block_rq_insert")
int BPF_PROG(btf_rq_insert, struct request *rq) { return on_rq_insert(rq); }
SEC("tp_btf/block_rq_issue")
int BPF_PROG(btf_rq_issue, struct request *rq) { return on_rq_issue(rq); }
SEC("tp_btf/block_rq_complete")
int BPF_PROG(btf_rq_complete, struct request *rq) { return on_rq_complete(rq); }

SEC("tp_btf/block_rq_requeue")
int BPF_PROG(btf_rq_requeue, struct request *rq) { return on_rq_requeue(rq); }

SEC("raw_tp/block_bio_queue")
int BPF_PROG(raw_bio_queue, struct bio *bio) { return on_bio_queue(bio); }
SEC("raw_tp/block_rq_insert")
int BPF_PROG(raw_rq_insert, struct request *rq) { return on_rq_insert(rq); }
SEC("raw_tp/block_rq_issue")
int BPF_PROG(raw_rq_issue, struct request *rq) { return on_rq_issue(rq); }
SEC("raw_tp/block_rq_complete")
int BPF_PROG(raw_rq_complete, struct request *rq) { return on_rq_complete(rq); }
SEC("raw_tp/block_rq_requeue")
int BPF_PROG(raw_rq_requeue, struct request *rq) { return on_rq_requeue(rq); }
