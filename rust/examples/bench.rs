//! `Tensor::from_vec` (adoption, zero-copy) against a copying construction (what a safe constructor that copies
//! does: the Vec's data cloned into a new buffer), at several sizes. Prints one JSON object (times are medians).
//!   cargo run --release --example bench [-- --max 100000000 --repeat 5]
use std::time::Instant;
use tensorwire::Tensor;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str, default: usize| {
        args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).and_then(|s| s.parse().ok()).unwrap_or(default)
    };
    let max = arg("--max", 100_000_000);
    let repeat = arg("--repeat", 5);
    let mut rows = Vec::new();
    let mut n = 10_000usize;
    while n <= max {
        let (mut adopt, mut copy) = (Vec::new(), Vec::new());
        for _ in 0..repeat {
            let v = vec![6.0f64; n];
            // The first small heap allocation after a large mapping pays ~10 us of page faults in malloc;
            // a tiny adoption first keeps that out of what is measured.
            drop(Tensor::from_vec(vec![0u8; 16], &[16]).unwrap());
            let t0 = Instant::now();
            let t = Tensor::from_vec(v, &[n]).unwrap();
            adopt.push(t0.elapsed().as_secs_f64());
            std::hint::black_box(&t);
            drop(t);

            let v = vec![6.0f64; n];
            let t0 = Instant::now();
            let t = Tensor::from_slice(&v, &[n]).unwrap(); // clone into a new buffer, then wrap
            copy.push(t0.elapsed().as_secs_f64());
            std::hint::black_box(&t);
        }
        let (a, c) = (median(adopt), median(copy));
        rows.push(format!(
            "{{\"n\": {n}, \"bytes\": {}, \"from_vec_s\": {a:.9}, \"copying_s\": {c:.9}, \"speedup\": {:.1}}}",
            n * 8,
            c / a
        ));
        n *= 100;
    }
    println!("{{\"bench\": \"rust_from_vec\", \"repeat\": {repeat}, \"rows\": [{}]}}", rows.join(", "));
}
