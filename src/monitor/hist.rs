//! The log-linear histogram the BPF programs fill (src/monitor/bpf/block.h): values below
//! 2^SUB_BITS each have a bucket, then every power of two is cut in 2^SUB_BITS equal buckets,
//! so a bucket is at most 1/8 of its lower bound wide. Quantiles interpolate inside a bucket.

pub const SUB_BITS: u32 = super::defines::SUB_BITS as u32;
pub use super::defines::NR_BUCKETS;
const SUB: u64 = 1 << SUB_BITS;

/// The bucket of a value, as `bucket_of` in block.bpf.c computes it.
pub fn bucket_of(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let sub = (v >> (e - SUB_BITS)) & (SUB - 1);
    let idx = (((e - SUB_BITS + 1) as u64) << SUB_BITS) + sub;
    (idx as usize).min(NR_BUCKETS - 1)
}

/// Lower bound (inclusive) of bucket `i`.
pub fn bucket_low(i: usize) -> u64 {
    if (i as u64) < SUB {
        return i as u64;
    }
    let e = (i as u32 >> SUB_BITS) + SUB_BITS - 1;
    let sub = i as u64 & (SUB - 1);
    (SUB + sub) << (e - SUB_BITS)
}

/// Upper bound (exclusive) of bucket `i`; the last bucket is open, its bound is nominal.
pub fn bucket_high(i: usize) -> u64 {
    if (i as u64) < SUB {
        return i as u64 + 1;
    }
    let e = (i as u32 >> SUB_BITS) + SUB_BITS - 1;
    bucket_low(i) + (1 << (e - SUB_BITS))
}

/// The `q` quantile (0..=1) of the values counted in `buckets`, interpolated linearly inside
/// the bucket that holds it; None when empty.
pub fn quantile(buckets: &[u64], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    // rank of the wanted value, 1-based, as in "the smallest value with at least q of all at or below it"
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, &n) in buckets.iter().enumerate() {
        if n == 0 {
            continue;
        }
        if seen + n >= rank {
            let (lo, hi) = (bucket_low(i) as f64, bucket_high(i) as f64);
            let frac = (rank - seen) as f64 / n as f64;
            // exact buckets (width 1) hold a single value
            return Some(if hi - lo <= 1.0 { lo } else { lo + (hi - lo) * frac });
        }
        seen += n;
    }
    None
}

/// The non-empty buckets as (lower bound, count) pairs.
pub fn sparse(buckets: &[u64]) -> Vec<[u64; 2]> {
    buckets.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, n)| [bucket_low(i), *n]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_in_order() {
        let mut prev = 0;
        for v in (0..5000).chain((12..44).flat_map(|e| [(1u64 << e) - 1, 1 << e, (1 << e) + 12345 % (1 << e)])) {
            let b = bucket_of(v);
            assert!(b >= prev || v < 5000 || b == NR_BUCKETS - 1 || bucket_low(b) <= v, "v {v}");
            if b < NR_BUCKETS - 1 {
                assert!(bucket_low(b) <= v && v < bucket_high(b), "v {v} in bucket {b} [{}, {})", bucket_low(b), bucket_high(b));
                // at least 8 buckets per power of two: width at most 1/8 of the lower bound
                assert!((bucket_high(b) - bucket_low(b)) * 8 <= bucket_low(b).max(8), "v {v}");
            }
            if v < 5000 {
                prev = b;
            }
        }
        for i in 0..NR_BUCKETS - 1 {
            assert_eq!(bucket_high(i), bucket_low(i + 1), "bucket {i}");
            assert_eq!(bucket_of(bucket_low(i)), i);
        }
        assert_eq!(bucket_of(u64::MAX), NR_BUCKETS - 1);
    }

    #[test]
    fn quantiles() {
        let mut b = vec![0u64; NR_BUCKETS];
        assert_eq!(quantile(&b, 0.5), None);
        for v in 1..=1000u64 {
            b[bucket_of(v * 1000)] += 1;
        }
        for q in [0.5, 0.95, 0.99] {
            let got = quantile(&b, q).unwrap();
            let want = q * 1_000_000.0;
            assert!((got - want).abs() / want < 1.0 / 16.0, "q {q}: {got} vs {want}");
        }
        let mut one = vec![0u64; NR_BUCKETS];
        one[5] = 3;
        assert_eq!(quantile(&one, 0.99), Some(5.0));
    }
}
