//! Cost of Engine::plan for one request, with and without 100k non-matching rules.
//! `cargo bench --bench planbench`
use faultline::fault::Engine;
use faultline::spec::rule::{Action, FlipAt, Op, Rule, Target};
use std::time::Instant;
fn main() {
    let data: Vec<u8> = (0..128 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    for rules in [false, true] {
        let e = Engine::new(4096);
        if rules {
            let mut v = Vec::new();
            for i in 0..50_000u64 {
                v.push(Rule::new(Action::Bitflip { at: FlipAt::default() }, &[Op::Write], Target::Content { hash: (i as u128) * 0x9E3779B97F4A7C15 }));
                v.push(Rule::new(Action::Error { errno: 5 }, &[Op::Read], Target::Range { start: (1 << 30) + i * 4096, end: (1 << 30) + i * 4096 + 4096 }));
            }
            e.add(v);
        }
        for (len, n) in [(4096usize, 200_000), (128 * 1024, 20_000)] {
            let t = Instant::now();
            for i in 0..n {
                let p = e.plan(Op::Write, (i as u64 % 1000) * len as u64, len as u64, Some(&data[..len]));
                assert!(p.is_clean());
            }
            let w = t.elapsed().as_secs_f64() / n as f64 * 1e6;
            let t = Instant::now();
            for i in 0..n {
                let p = e.plan(Op::Read, (i as u64 % 1000) * len as u64, len as u64, Some(&data[..len]));
                assert!(p.is_clean());
            }
            let r = t.elapsed().as_secs_f64() / n as f64 * 1e6;
            println!("rules={rules} len={len}: write plan {w:.2} us, read plan {r:.2} us");
        }
    }
}
