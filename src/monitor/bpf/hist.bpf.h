// The log-linear histogram shared by block.bpf.c, pairs.bpf.c and syscall.bpf.c (its buckets
// are read back by src/monitor/hist.rs): exact below 2^SUB_BITS ns, then 2^SUB_BITS buckets
// per power of two; the last bucket takes everything above.
#ifndef FAULTLINE_HIST_BPF_H
#define FAULTLINE_HIST_BPF_H

#include "block.h" // struct hist, SUB_BITS, NR_BUCKETS

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

static __always_inline u32 bucket_of(u64 v)
{
	if (v < (1 << SUB_BITS))
		return v;
	u32 e = log2_u64(v);
	u32 sub = (v >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
	u32 idx = ((e - SUB_BITS + 1) << SUB_BITS) + sub;
	return idx < NR_BUCKETS ? idx : NR_BUCKETS - 1;
}

// Add one interval to a histogram shared between CPUs (atomic adds).
static __always_inline void hist_add_shared(struct hist *h, u64 ns, u64 bytes)
{
	u32 b = bucket_of(ns);
	if (b >= NR_BUCKETS)
		return;
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, ns);
	if (bytes)
		__sync_fetch_and_add(&h->bytes, bytes);
	__sync_fetch_and_add(&h->buckets[b], 1);
}

// Add one interval to this CPU's copy of a per-CPU histogram (plain adds: a BPF program is
// not preempted by another run of itself on the same CPU).
static __always_inline void hist_add_cpu(struct hist *h, u64 ns, u64 bytes)
{
	u32 b = bucket_of(ns);
	if (b >= NR_BUCKETS)
		return;
	h->count++;
	h->sum_ns += ns;
	h->bytes += bytes;
	h->buckets[b]++;
}

#endif
