//! Verification cost beside its floor and its peers, at 1 KiB, 64 KiB and 1 MiB.
//!
//! - `floor/hmac`: a bare HMAC-SHA256 over the same signed bytes (key set up per call, as
//!   a hand-written receiver does) — the cost any verifier must pay.
//! - `<scheme>/1-secret`: `Verifier::verify` with one secret.
//! - `<scheme>/3-secrets-oldest`: three secrets, the delivery signed with the *last*
//!   (oldest) one — the worst case, three MACs. With the current secret first it costs
//!   the same as one secret.
//! - `peer/svix`, `peer/standardwebhooks`: those crates verifying the same Standard
//!   Webhooks delivery.
//!
//! `cargo bench --bench verify`; ratios in BENCHMARKS.md.

use std::hint::black_box;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tower_webhook::{Scheme, Verifier};

const SIZES: [(usize, &str); 3] = [(1024, "1KiB"), (64 * 1024, "64KiB"), (1024 * 1024, "1MiB")];

fn secrets(scheme: &Scheme) -> [&'static str; 3] {
    match scheme.name() {
        "standard" => [
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
            "whsec_c3RyYW5nZXItc2VjcmV0LTAxMjM0NTY3",
        ],
        _ => [
            "whsec_bench_secret_current_0001",
            "whsec_bench_secret_previous_002",
            "whsec_bench_secret_oldest_00003",
        ],
    }
}

fn body(size: usize) -> Bytes {
    let mut body = br#"{"id":"evt_bench","type":"bench","data":{"blob":""#.to_vec();
    body.resize(size - 3, b'a');
    body.extend_from_slice(b"\"}}");
    Bytes::from(body)
}

fn floor(c: &mut Criterion) {
    let mut group = c.benchmark_group("floor");
    let key = b"whsec_bench_secret_current_0001";
    let prefix = b"msg_bench_0000000000000000.1700000000.";
    for (size, label) in SIZES {
        let body = body(size);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("hmac", label), &body, |b, body| {
            b.iter(|| {
                let mut mac = Hmac::<Sha256>::new_from_slice(black_box(key)).unwrap();
                mac.update(prefix);
                mac.update(body);
                black_box(mac.finalize().into_bytes())
            })
        });
    }
}

fn schemes(c: &mut Criterion) {
    for scheme in [
        Scheme::standard(),
        Scheme::stripe(),
        Scheme::github(),
        Scheme::slack(),
        Scheme::shopify(),
    ] {
        let mut group = c.benchmark_group(scheme.name().to_owned());
        let all = secrets(&scheme);
        for (size, label) in SIZES {
            let body = body(size);
            group.throughput(Throughput::Bytes(size as u64));
            for (name, held, signer) in [
                ("1-secret", &all[..1], all[0]),
                ("3-secrets-oldest", &all[..], all[2]),
            ] {
                let verifier = Verifier::new(scheme.clone(), held).unwrap();
                let headers = scheme
                    .sign(
                        [signer],
                        "msg_bench_0000000000000000",
                        SystemTime::now(),
                        &body,
                    )
                    .unwrap();
                assert!(verifier.verify(&headers, body.clone()).is_ok());
                group.bench_with_input(BenchmarkId::new(name, label), &body, |b, body| {
                    b.iter(|| black_box(verifier.verify(&headers, body.clone()).is_ok()))
                });
            }
        }
    }
}

fn peers(c: &mut Criterion) {
    let mut group = c.benchmark_group("peer");
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    for (size, label) in SIZES {
        let body = body(size);
        group.throughput(Throughput::Bytes(size as u64));
        // The peers read the real clock (5-minute window): sign with it.
        let headers = Scheme::standard()
            .sign(
                [secret],
                "msg_bench_0000000000000000",
                SystemTime::now(),
                &body,
            )
            .unwrap();
        let svix = svix::webhooks::Webhook::new(secret).unwrap();
        assert!(svix.verify(&body, &headers).is_ok());
        group.bench_with_input(BenchmarkId::new("svix", label), &body, |b, body| {
            b.iter(|| black_box(svix.verify(body, &headers).is_ok()))
        });
        let sw = standardwebhooks::Webhook::new(secret).unwrap();
        assert!(sw.verify(&body, &headers).is_ok());
        group.bench_with_input(
            BenchmarkId::new("standardwebhooks", label),
            &body,
            |b, body| b.iter(|| black_box(sw.verify(body, &headers).is_ok())),
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = floor, schemes, peers
}
criterion_main!(benches);
