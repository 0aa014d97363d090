// Windows of a `baseline: windows` run for the monitor's programs (loader side:
// src/monitor/window.rs): an interval timed by a program (a request's queue or service, a
// pair, a system call) counts for window k when it starts at or after the window's measured
// span begins and ends by its end, the rule the workload sorts its ops by
// (spec::windows::WindowPlan::window_of), on the same clock (CLOCK_MONOTONIC: bpf_ktime_get_ns,
// the kernel's stamps and Rust's Instant). Its figures go to `whists` keyed by window and the
// program's histogram index. Without windows (win_n 0, fixed at load) the verifier drops all
// of it.
#ifndef FAULTLINE_WIN_BPF_H
#define FAULTLINE_WIN_BPF_H

#include "block.h" // struct hist
#include "hist.bpf.h"

// Set by the loader before load: windows (0: none), their length and settle.
const volatile u32 win_n = 0;
const volatile u64 win_len_ns = 0;
const volatile u64 win_settle_ns = 0;

// [0]: window 0's start on the monotonic clock (the workload's start plus its warm-up), set
// from user space once the workload started; 0 until then (nothing is counted).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} win_t0 SEC(".maps");

// Per-window histograms, key window << 32 | histogram index. Allocated as used (the loader
// sets BPF_F_NO_PREALLOC and the size with windows; one preallocated entry without).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, u64);
	__type(value, struct hist);
} whists SEC(".maps");

// [0]: intervals in a window left uncounted because their window's histogram could not be
// made (the kernel's allocator had no memory at hand in that context)
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} win_lost SEC(".maps");

// An empty histogram to insert from (too big for the BPF stack); never written.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct hist);
} win_zero SEC(".maps");

// The window whose measured span [t0 + k len + settle, t0 + (k + 1) len] holds [start, end],
// or -1.
static __always_inline int window_of(u64 start, u64 end)
{
	if (!win_n || !win_len_ns)
		return -1;
	u32 z = 0;
	u64 *t0p = bpf_map_lookup_elem(&win_t0, &z);
	if (!t0p)
		return -1;
	u64 t0 = *t0p;
	if (!t0 || start < t0 || end < start)
		return -1;
	u64 k = (start - t0) / win_len_ns;
	if (k >= win_n)
		return -1;
	u64 from = t0 + k * win_len_ns;
	if (start < from + win_settle_ns || end > from + win_len_ns)
		return -1;
	return (int)k;
}

// Add the interval [start, end] to histogram `idx` of its window, if it is in one.
static __always_inline void win_add(u32 idx, u64 start, u64 end, u64 bytes)
{
	if (!win_n)
		return;
	int k = window_of(start, end);
	if (k < 0)
		return;
	u64 key = ((u64)k << 32) | idx;
	struct hist *h = bpf_map_lookup_elem(&whists, &key);
	if (!h) {
		u32 z = 0;
		struct hist *zero = bpf_map_lookup_elem(&win_zero, &z);
		if (!zero)
			return;
		// NOEXIST: another CPU may have inserted it meanwhile; either way it is there now
		bpf_map_update_elem(&whists, &key, zero, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&whists, &key);
		if (!h) {
			u64 *lost = bpf_map_lookup_elem(&win_lost, &z);
			if (lost)
				__sync_fetch_and_add(lost, 1);
			return;
		}
	}
	hist_add_shared(h, end - start, bytes);
}

#endif
