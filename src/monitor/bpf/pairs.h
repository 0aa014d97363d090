// Shared by pairs.bpf.c and, through the skeleton's types, src/monitor/pairs.rs.
#ifndef FAULTLINE_PAIRS_H
#define FAULTLINE_PAIRS_H

#include "block.h"

#define MAX_PAIR_DEVS 16
#define MAX_ATTACH 128
#define PAIRS_PER_ATTACH 4
#define MAX_PAIR_HISTS 256
#define MAX_SUMS 4
#define SUM_FIELDS 12
// The driver layer's FUSE programs (tp_btf/raw_tp): connections watched, opcodes kept apart
// (the last takes the rest)
#define MAX_FUSE_CONNS 16
#define FUSE_NCLASS 64
#define FUSE_SLOTS 16384 // a power of two

// One pair as seen from one of its two events: where that event keeps the key, the device
// and (enter side) the class field.
struct att_pair {
	u32 hist_base; // the pair's first histogram; nclass of them
	u32 nclass; // >= 1: class values at or above nclass-1 share the last one
	u16 key_off; // 0 with key_size 0: key by thread id
	u16 key_size;
	u16 dev_off; // 0: the event has no device field (no device filter)
	u16 class_off; // enter side, with class_size > 0
	u16 class_size;
	u16 key_dev; // 1: the key is (device, field) (e.g. jbd2's transaction ids are per journal)
	u16 tgid_filter; // 1: only threads of the watched processes
	u16 pad;
	u32 pair; // the pair's index, part of the start-time key
	u32 pad2;
};

// One attachment (one tracepoint and side) serves up to PAIRS_PER_ATTACH pairs.
struct att_cfg {
	u32 npairs;
	u32 pad;
	struct att_pair p[PAIRS_PER_ATTACH];
};

struct skey {
	u32 pair;
	u32 pad;
	u64 key;
};

struct sval {
	u64 ts;
	u32 class;
	u32 pad;
};

// A summed event (jbd2_run_stats): fields added up per event.
struct sum_cfg {
	u16 dev_off; // 0: no device filter
	u16 nfields;
	u16 off[SUM_FIELDS];
	u16 size[SUM_FIELDS];
};

struct sum_val {
	u64 count;
	u64 sum[SUM_FIELDS];
	u64 max[SUM_FIELDS];
};

struct pair_stat {
	u64 unmatched; // exits whose enter was not seen (started before attach, or evicted)
	u64 untracked; // enters whose start could not be stored
};

#endif
