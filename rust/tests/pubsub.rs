//! Publish/subscribe from Rust: Rust to Rust, and Rust to Python and back in real separate processes, with every
//! dtype, strided layouts, loans (zero-copy) and metadata of every kind.
mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use tensorwire::{
    CopyMode, DType, Device, Element, ErrorKind, Metadata, OnFull, Publisher, PublisherOptions, SendOptions, Subscriber,
    SubscriberOptions, Tensor,
    Value, BF16, F16,
};

const SECS: Option<Duration> = Some(Duration::from_secs(20));

#[test]
fn rust_to_rust_with_end_of_stream() {
    let topic = common::topic("rr");
    let sub = Subscriber::new(&topic).unwrap();
    let p = Publisher::new(&topic, PublisherOptions { depth: 4, ..Default::default() }).unwrap();
    assert_eq!(sub.recv(Some(Duration::from_millis(1))).unwrap_err().kind(), ErrorKind::Timeout);
    assert_eq!(p.subscriber_count(), 1);
    let mut buf = p.loan::<i64>(&[3, 5]).unwrap();
    for (i, x) in buf.as_mut_slice().iter_mut().enumerate() {
        *x = i as i64 * 3;
    }
    assert_eq!(p.send_with(buf, &Metadata::new().with("step", 1), None).unwrap(), 1);
    let strided = Tensor::from_vec((0..20).map(|i| i as f32).collect(), &[4, 5]).unwrap().slice(1, 4, -6, -2).unwrap();
    p.send(&strided).unwrap(); // by reference: the caller keeps it
    assert!(strided.is_exclusive(), "a tensor that was copied into the message stays the caller's alone");
    p.close();

    let t = sub.recv(SECS).unwrap();
    assert!(t.is_readonly());
    assert_eq!(t.shape(), &[3, 5]);
    assert_eq!(t.as_slice::<i64>().unwrap()[14], 42);
    assert_eq!(t.metadata().unwrap().get("step"), Some(&Value::Int(1)));
    let t2 = sub.recv(SECS).unwrap();
    assert_eq!(t2.to_vec::<f32>().unwrap(), strided.to_vec::<f32>().unwrap());
    let end = sub.recv(SECS).unwrap_err();
    assert_eq!(end.kind(), ErrorKind::EndOfStream);
    assert!(sub.is_closed());
    assert_eq!(t.as_slice::<i64>().unwrap()[1], 3, "received tensors outlive the stream");
}

#[test]
fn a_loan_sent_by_reference_is_never_writable_again() {
    let topic = common::topic("byref");
    let sub = Subscriber::new(&topic).unwrap();
    // Even with protection off (nothing would fault), safe Rust must not get a &mut into a sent message.
    let p = Publisher::new(&topic, PublisherOptions { protect_sent_loans: false, ..Default::default() }).unwrap();
    let _ = sub.recv(Some(Duration::from_millis(1)));
    let mut loan = p.loan::<f32>(&[8]).unwrap();
    loan.as_mut_slice().fill(3.0);
    let mut t = loan.into_tensor();
    assert!(t.is_exclusive());
    p.send(&t).unwrap();
    assert!(!t.is_exclusive());
    assert_eq!(t.as_mut_slice::<f32>().unwrap_err().kind(), ErrorKind::Shared);
    let got = sub.recv(SECS).unwrap();
    assert_eq!(got.as_slice::<f32>().unwrap(), &[3.0; 8]);
    drop(p);
    let rest: Vec<_> = sub.iter().collect();
    assert!(rest.is_empty(), "the iterator ends at end-of-stream");
}

#[test]
fn a_subscriber_delivers_on_the_device_it_names_and_refuses_one_it_lacks() {
    let topic = common::topic("device");
    // No machine has a 1000th GPU: refused when the subscriber is made (no driver here, or no such ordinal).
    let e = Subscriber::with_options(&topic, SubscriberOptions { device: Some(Device::cuda(999)), ..Default::default() })
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::DeviceUnavailable | ErrorKind::InvalidArgument), "{e}");
    assert!(e.message().contains("cuda:999"), "{e}");
    let e = Subscriber::with_options(&topic, SubscriberOptions { device: Some(Device { kind: 999, id: 0 }), ..Default::default() })
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    let sub = Subscriber::with_options(&topic, SubscriberOptions { device: Some(Device::CPU), ..Default::default() }).unwrap();
    let p = Publisher::new(&topic, PublisherOptions::default()).unwrap();
    p.send(Tensor::from_vec((0..8).map(|i| i as f32).collect(), &[8]).unwrap()).unwrap();
    let got = sub.recv(SECS).unwrap();
    assert_eq!(got.device(), Device::CPU);
    assert_eq!(got.as_slice::<f32>().unwrap()[5], 5.0);
}

#[test]
fn send_options_loans_on_a_device_and_how_each_tensor_came() {
    let topic = common::topic("sendopts");
    let sub = Subscriber::new(&topic).unwrap();
    let p = Publisher::new(&topic, PublisherOptions::default()).unwrap();
    // A loan crosses without a copy ("shm"), even with copy forbidden.
    let mut loan = p.loan_on(DType::F32, &[2, 3], Device::CPU, SECS).unwrap();
    assert_eq!(loan.device(), Device::CPU);
    loan.as_mut_slice::<f32>().unwrap().copy_from_slice(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let mut md = Metadata::new();
    md.insert("step", Value::Int(7));
    let never = SendOptions { copy: CopyMode::Never, metadata: md, timeout: SECS, ..Default::default() };
    assert_eq!(p.send_options(&loan, &never).unwrap(), 1);
    let got = sub.recv(SECS).unwrap();
    assert_eq!(got.transport(), Some("shm"));
    assert_eq!(got.as_slice::<f32>().unwrap(), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(got.metadata().unwrap().get("step"), Some(&Value::Int(7)));
    // The caller's own memory needs a copy: forbidden, it is an error naming why, and nobody got anything.
    let mine = Tensor::from_vec((0..6).collect::<Vec<i32>>(), &[3, 2]).unwrap();
    assert_eq!(mine.transport(), None, "made by no transport");
    let e = p.send_options(&mine.transpose(0, 1).unwrap(), &never).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CopyRequired, "{e}");
    assert!(sub.try_recv().unwrap().is_none());
    // Allowed, it crosses with one copy and says so, its layout kept (a dense transpose is copied as it is).
    let once = SendOptions { copy: CopyMode::Always, ..Default::default() };
    assert_eq!(p.send_options(&mine.transpose(0, 1).unwrap(), &once).unwrap(), 1);
    let got = sub.recv(SECS).unwrap();
    assert_eq!(got.transport(), Some("shm-copy"));
    assert_eq!(got.shape(), &[2, 3]);
    assert!(same_values(&got, &mine.transpose(0, 1).unwrap()));
    // No machine has a 1000th GPU, and a device kind tensorwire does not know is refused.
    let e = p.loan_on(DType::F32, &[4], Device::cuda(999), SECS).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::DeviceUnavailable | ErrorKind::InvalidArgument), "{e}");
    let e = p.loan_on(DType::F32, &[4], Device { kind: 999, id: 0 }, SECS).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Unsupported | ErrorKind::InvalidArgument), "{e}");
    assert!(e.message().contains("999"), "{e}");
}

#[test]
fn would_block_and_timeouts_are_errors_not_hangs() {
    let topic = common::topic("full");
    let sub = Subscriber::new(&topic).unwrap();
    let p =
        Publisher::new(&topic, PublisherOptions { depth: 1, on_full: OnFull::Raise, ..Default::default() }).unwrap();
    let _ = sub.recv(Some(Duration::from_millis(1)));
    let x = Tensor::zeros(DType::U8, &[16]).unwrap();
    p.send(&x).unwrap();
    let e = p.send(&x).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
    assert!(e.message().contains("unread"), "{e}");
    // A loan whose send by reference failed was read by nobody: it stays writable.
    let mut kept = p.loan::<u8>(&[4]).unwrap().into_tensor();
    assert_eq!(p.send(&kept).unwrap_err().kind(), ErrorKind::WouldBlock);
    assert!(kept.is_exclusive());
    kept.as_mut_slice::<u8>().unwrap().fill(5);
    drop(kept);
    // A filled loan that could not be sent comes back intact, and goes once there is room.
    let mut buf = p.loan::<u16>(&[4]).unwrap();
    buf.as_mut_slice().copy_from_slice(&[1, 2, 3, 4]);
    let back = p.try_send_with(buf, &Metadata::new(), None).unwrap_err();
    assert_eq!(back.error.kind(), ErrorKind::WouldBlock);
    let buf = back.message;
    assert_eq!(buf.as_slice(), &[1, 2, 3, 4]);
    assert_eq!(sub.recv(SECS).unwrap().shape(), &[16]);
    assert_eq!(p.send(buf).unwrap(), 1);
    assert_eq!(sub.recv(SECS).unwrap().as_slice::<u16>().unwrap(), &[1, 2, 3, 4]);
    // A blocking publisher with nobody subscribed delivers to nobody, at once.
    let blocking = Publisher::new(&common::topic("full2"), PublisherOptions::default()).unwrap();
    assert_eq!(blocking.send(&x).unwrap(), 0);
    let e = Publisher::new("bad name!", Default::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("bad name!"), "{e}");
    let lonely = Subscriber::new(&common::topic("nobody")).unwrap();
    let t0 = std::time::Instant::now();
    let e = lonely.recv(Some(Duration::from_millis(50))).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(e.message().contains("no message on"), "{e}");
    assert!(e.message().contains("within 50 ms (no publisher of"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(lonely.try_recv().unwrap().is_none());
    blocking.close();
}

/// The dtypes both sides know, with NumPy's names, and the pattern each message carries: element k of a 3x4
/// matrix is k % 5 (bool: k % 2 == 1), sent transposed.
const DTYPES: &[&str] = &[
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16", "float32",
    "float64",
];

fn pattern<T: Element>(f: impl Fn(usize) -> T) -> Tensor {
    Tensor::from_vec((0..12).map(f).collect(), &[3, 4]).unwrap().transpose(0, 1).unwrap()
}

fn half_bits(k: usize) -> u16 {
    [0x0000, 0x3C00, 0x4000, 0x4200, 0x4400][k]
}

fn pattern_of(name: &str) -> Tensor {
    match name {
        "bool" => pattern(|k| k % 2 == 1),
        "int8" => pattern(|k| (k % 5) as i8),
        "int16" => pattern(|k| (k % 5) as i16),
        "int32" => pattern(|k| (k % 5) as i32),
        "int64" => pattern(|k| (k % 5) as i64),
        "uint8" => pattern(|k| (k % 5) as u8),
        "uint16" => pattern(|k| (k % 5) as u16),
        "uint32" => pattern(|k| (k % 5) as u32),
        "uint64" => pattern(|k| (k % 5) as u64),
        "float16" => pattern(|k| F16(half_bits(k % 5))),
        "bfloat16" => pattern(|k| BF16::from_f32_truncated((k % 5) as f32)),
        "float32" => pattern(|k| (k % 5) as f32),
        "float64" => pattern(|k| (k % 5) as f64),
        _ => unreachable!(),
    }
}

fn same_values(a: &Tensor, b: &Tensor) -> bool {
    a.dtype() == b.dtype() && a.shape() == b.shape() && raw_bytes(a) == raw_bytes(b)
}

fn raw_bytes(t: &Tensor) -> Vec<u8> {
    let d = t.contiguous().unwrap();
    let n = d.nbytes();
    unsafe { std::slice::from_raw_parts(d.data_ptr() as *const u8, n) }.to_vec()
}

const PY_SUBSCRIBER: &str = r#"
import sys, numpy as np, ml_dtypes, tensorwire as tw
topic, names = sys.argv[1], sys.argv[2].split(",")
sub = tw.Subscriber(topic)
print("ready", flush=True)
t = sub.recv(timeout=20)
a = np.from_dlpack(t)
assert t.readonly and a.shape == (1024, 3) and a.dtype == np.float32 and (a == 1.0).all(), (t, a)
assert a.ctypes.data == t.data_ptr, "np.from_dlpack of a received loan is zero-copy"
md = dict(t.metadata)
assert md == {"step": 7, "tag": "rust", "pair": (1, "x"), "raw": b"\x00\xff", "nested": {"l": [1.5, None, True]}}, md
print("ok loan", flush=True)
for name in names:
    t = sub.recv(timeout=20)
    assert dict(t.metadata) == {"dtype": name}, dict(t.metadata)
    assert str(t.dtype) == name, (t.dtype, name)
    k = np.arange(12).reshape(3, 4).T
    want = (k % 2 == 1) if name == "bool" else (k % 5).astype(getattr(ml_dtypes, name, None) or np.dtype(name))
    got = np.asarray(t) if name == "bfloat16" else np.from_dlpack(t)
    assert got.shape == (4, 3) and np.array_equal(got.astype(np.float64), want.astype(np.float64)), (name, got)
    print("ok", name, flush=True)
try:
    sub.recv(timeout=20)
    raise AssertionError("a message after the publisher closed")
except EOFError:
    assert sub.closed
print("ok end", flush=True)
"#;

#[test]
fn rust_publisher_to_python_subscriber() {
    let topic = common::topic("rpy");
    let mut child = common::python()
        .args(["-c", PY_SUBSCRIBER, &topic, &DTYPES.join(",")])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the Python subscriber did not start");

    let p = Publisher::new(&topic, Default::default()).unwrap(); // connects to the waiting subscriber
    assert_eq!(p.subscriber_count(), 1);
    let mut buf = p.loan::<f32>(&[1024, 3]).unwrap();
    buf.as_mut_slice().fill(1.0);
    let meta = Metadata::new()
        .with("step", 7)
        .with("tag", "rust")
        .with("pair", Value::Tuple(vec![1.into(), "x".into()]))
        .with("raw", Value::Bytes(vec![0, 255]))
        .with("nested", Metadata::new().with("l", Value::List(vec![1.5.into(), Value::None, true.into()])));
    assert_eq!(p.send_with(buf, &meta, SECS).unwrap(), 1);
    for name in DTYPES {
        let t = pattern_of(name);
        assert_eq!(t.dtype().to_string(), *name);
        p.send_with(t, &Metadata::new().with("dtype", *name), SECS).unwrap();
    }
    p.close();
    let mut lines = Vec::new();
    for l in out.lines() {
        lines.push(l.unwrap());
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "Python subscriber failed; its output: {lines:?}");
    let mut want = vec!["ok loan".to_string()];
    want.extend(DTYPES.iter().map(|n| format!("ok {n}")));
    want.push("ok end".into());
    assert_eq!(lines, want);
}

const PY_PUBLISHER: &str = r#"
import sys, time, numpy as np, ml_dtypes, tensorwire as tw
topic, names = sys.argv[1], sys.argv[2].split(",")
pub = tw.Publisher(topic)
deadline = time.monotonic() + 20
while pub.subscribers < 1:
    assert time.monotonic() < deadline, "no subscriber"
    time.sleep(0.005)
k = np.arange(12).reshape(3, 4)
for name in names:
    base = (k % 2 == 1) if name == "bool" else (k % 5).astype(getattr(ml_dtypes, name, None) or np.dtype(name))
    pub.send(tw.asarray(base).transpose(0, 1), metadata={"dtype": name})
pub.send({"image": tw.asarray(k), "mask": tw.asarray(k % 2 == 1)})  # a message of two tensors
buf = pub.loan((16, 8), "float64")
np.asarray(buf)[:] = np.arange(128).reshape(16, 8) * 0.5
pub.send(buf, metadata={"nested": {"a": [1, 2.5, None, True]}, "bytes": b"\x01\x02", "t": (1, "x"), "s": "ünï"})
pub.close()
"#;

#[test]
fn python_publisher_to_rust_subscriber() {
    let topic = common::topic("pyr");
    let sub = Subscriber::new(&topic).unwrap();
    let mut child = common::python().args(["-c", PY_PUBLISHER, &topic, &DTYPES.join(",")]).spawn().unwrap();
    for name in DTYPES {
        let t = sub.recv(SECS).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.metadata().unwrap().get("dtype"), Some(&Value::Str(name.to_string())));
        let want = pattern_of(name);
        assert!(same_values(&t, &want), "{name}: got {t:?}");
    }
    // The dict message is skipped with an error saying why, and iteration goes on to the next message.
    let mut it = sub.iter();
    let e = it.next().unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.message().contains("a message of 2 tensors"), "{e}");
    let t = it.next().unwrap().unwrap();
    assert_eq!(t.shape(), &[16, 8]);
    assert_eq!(t.as_slice::<f64>().unwrap()[127], 63.5);
    let md = t.metadata().unwrap();
    assert_eq!(
        md.get("nested"),
        Some(&Value::Dict(Metadata::new().with("a", Value::List(vec![1.into(), 2.5.into(), Value::None, true.into()]))))
    );
    assert_eq!(md.get("bytes"), Some(&Value::Bytes(vec![1, 2])));
    assert_eq!(md.get("t"), Some(&Value::Tuple(vec![1.into(), "x".into()])));
    assert_eq!(md.get("s"), Some(&Value::Str("ünï".into())));
    assert!(it.next().is_none(), "end of stream ends the iteration");
    assert!(child.wait().unwrap().success());
}

#[test]
fn the_ucx_in_use_is_named_and_a_late_preference_is_refused() {
    match tensorwire::net::ucx_unavailable_reason() {
        Some(why) => {
            assert!(tensorwire::net::ucx_version().is_none(), "no usable UCX, yet a version: {why}");
            eprintln!("skipped: UCX cannot run here: {why}");
        }
        None => {
            let lib = tensorwire::net::ucx_library().expect("a usable UCX has a file");
            assert!(lib.contains("libucp"), "{lib}");
            let version = tensorwire::net::ucx_version().expect("and a version");
            let parts: Vec<u32> = version.split('.').map(|p| p.parse().expect("numeric")).collect();
            assert!(parts.len() == 3 && parts[0] == 1 && parts[1] >= 12, "{version}");
            assert!(!tensorwire::net::prefer_ucx_library("/nonexistent/libucp.so.0"), "UCX is loaded: too late");
            assert!(!tensorwire::net::prefer_ucx_library("a\0b"));
            assert_eq!(tensorwire::net::ucx_library().as_deref(), Some(lib.as_str()));
        }
    }
}

#[test]
fn across_machines_over_loopback_ucx_with_a_token() {
    let topic = common::topic("remote");
    // Reachable from other machines without a token or `insecure`: refused, naming why.
    let open = PublisherOptions { listen: Some("0.0.0.0:0".into()), ..Default::default() };
    let err = Publisher::new(&topic, open).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("token"), "{err}");
    let options = PublisherOptions { listen: Some(":0".into()), token: Some("s3cret".into()), ..Default::default() };
    let p = match Publisher::new(&topic, options) {
        Ok(p) => p,
        Err(e) if e.to_string().contains("UCX") => {
            eprintln!("skipped: UCX cannot run here: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let addr = p.address().expect("a listening publisher has an address");
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let local = Publisher::new(&common::topic("nolisten"), PublisherOptions::default()).unwrap();
    assert_eq!(local.address(), None);
    let sub = Subscriber::with_options(
        &topic,
        SubscriberOptions { connect: Some(addr), token: Some("s3cret".into()), ..Default::default() },
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while p.subscriber_count() < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(p.subscriber_count(), 1);
    let x = Tensor::from_vec((0..24).map(|i| i as f32).collect(), &[4, 6]).unwrap();
    let cols = x.slice(1, 1, 6, 2).unwrap(); // every other column, from the second
    assert_eq!(p.send_with(&cols, &Metadata::new().with("ts", 1.5), None).unwrap(), 1);
    let t = sub.recv(SECS).unwrap();
    assert_eq!(t.shape(), &[4, 3]);
    assert_eq!(t.to_vec::<f32>().unwrap(), cols.to_vec::<f32>().unwrap());
    assert_eq!(t.metadata().unwrap().get("ts"), Some(&Value::Float(1.5)));
    p.close();
    assert_eq!(sub.recv(SECS).unwrap_err().kind(), ErrorKind::EndOfStream);
}

#[test]
fn debug_output_of_options_never_shows_the_token() {
    let p = PublisherOptions { token: Some("s3cret-token".into()), listen: Some(":0".into()), ..Default::default() };
    let s = SubscriberOptions { token: Some("s3cret-token".into()), ..Default::default() };
    for text in [format!("{p:?}"), format!("{s:?}"), format!("{p:#?}")] {
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("<redacted>"), "{text}");
    }
    assert!(format!("{:?}", SubscriberOptions::default()).contains("token: None"));
    assert!(format!("{p:?}").contains("listen: Some(\":0\")"));
}
