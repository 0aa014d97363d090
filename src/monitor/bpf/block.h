// Shared by block.bpf.c and, through the skeleton's types, src/monitor/block.rs.
#ifndef FAULTLINE_BLOCK_H
#define FAULTLINE_BLOCK_H

#define MAX_DEVS 16
#define NR_LAYERS 2
#define LAYER_QUEUE 0
#define LAYER_SERVICE 1
#define NR_OPS 5
#define OP_READ 0
#define OP_WRITE 1
#define OP_FLUSH 2
#define OP_DISCARD 3
#define OP_OTHER 4
// 8 buckets per power of two; the last bucket (index 327, from 2^42 ns, about 73 min) takes
// everything above
#define SUB_BITS 3
#define NR_BUCKETS 328
#define NR_SLOTS 128

struct hist {
	u64 count;
	u64 sum_ns;
	u64 bytes;
	u64 buckets[NR_BUCKETS];
};

struct devstat {
	u64 noissue; // completions (with data) that carry no issue time
	u64 untracked; // issue times not stored (issue-time table full)
	u64 partial; // partial completions (their bytes counted, the request once at its end)
	u64 early; // completions of requests issued before the monitor started (not counted)
	u64 backwards; // completions whose clock read before their issue stamp (counted, service 0)
	u64 seen; // completion events the program ran for (every op, whole or partial)
	u64 dataless; // read/write completions with no bytes (a preflush write's flush end: not counted)
};

struct slot {
	u64 epoch; // interval number + 1; 0: never written
	u64 count[NR_OPS];
	u64 bytes[NR_OPS];
	u64 service_ns[NR_OPS];
	u64 queued[NR_OPS];
	u64 queue_ns[NR_OPS];
};

// Classic-tracepoint fallback: issue time by (device, sector).
struct rqkey {
	u32 dev;
	u32 pad;
	u64 sector;
};

#endif
