//! A Rust publisher for latency measurement (bench/bench_rust.py): waits for a subscriber, then sends `count`
//! small loans, one every `interval_us`, each stamped with CLOCK_MONOTONIC nanoseconds in metadata "t" — the clock
//! Python's time.monotonic_ns() reads — so the subscriber can compute one-way latency. Then closes the stream.
//!   cargo run --release --example pubsub -- <topic> <count> <interval_us> <elements>
use std::time::{Duration, Instant};
use tensorwire::{Metadata, Publisher};

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}
extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}
const CLOCK_MONOTONIC: i32 = 1;

fn monotonic_ns() -> i64 {
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn main() -> Result<(), tensorwire::Error> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: pubsub <topic> <count> <interval_us> <elements>");
        std::process::exit(2);
    }
    let (topic, count, interval_us, elements): (&str, usize, u64, usize) =
        (&args[1], args[2].parse().unwrap(), args[3].parse().unwrap(), args[4].parse().unwrap());
    let p = Publisher::new(topic, Default::default())?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while p.subscriber_count() < 1 {
        assert!(Instant::now() < deadline, "no subscriber within 20 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    let interval = Duration::from_micros(interval_us);
    for i in 0..count {
        let next = Instant::now() + interval;
        let mut buf = p.loan::<f32>(&[elements])?;
        buf.as_mut_slice().fill(i as f32);
        p.send_with(buf, &Metadata::new().with("t", monotonic_ns()), None)?;
        while Instant::now() < next {
            std::hint::spin_loop();
        }
    }
    p.close();
    Ok(())
}
