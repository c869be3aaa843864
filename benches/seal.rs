//! The per-call cost of sealing and opening a body (issue 34, `docs/design/
//! payload-protection.md` §11): `KeyRing::seal` (a random 192-bit nonce and
//! XChaCha20-Poly1305 under the current key) and `KeyRing::open` of what it sealed, at
//! 1 KiB and 64 KiB — what a sealed accept adds on the request's task and a claim on the
//! worker's, per body.
//!
//! - `seal/<size>`: one body sealed (the ciphertext allocated, the tag appended).
//! - `open/<size>`: the same ciphertext opened (the associated data rebuilt per call, as
//!   a store rebuilds it from the row).
//! - `open-older-key/<size>`: opened with the sealing key second in a ring of three (after
//!   a rotation, before rekey): the key found by id, so about the same.
//!
//! `cargo bench --all-features --bench seal`; figures in BENCHMARKS.md.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tower_webhook::seal::{Aad, Column, Key, KeyRing};

const SIZES: [(usize, &str); 2] = [(1024, "1KiB"), (64 * 1024, "64KiB")];

fn key(id: &str, byte: u8) -> Key {
    Key::new(id, [byte; 32]).unwrap()
}

fn body(size: usize) -> Vec<u8> {
    let mut body = br#"{"id":"evt_bench","type":"invoice.paid","data":{"blob":""#.to_vec();
    body.resize(size - 3, b'a');
    body.extend_from_slice(br#""}}"#);
    body
}

fn seal_and_open(c: &mut Criterion) {
    let ring = KeyRing::new([key("k1", 1)]).unwrap();
    let rotated = KeyRing::new([key("k2", 2), key("k1", 1), key("k0", 0)]).unwrap();
    let mut group = c.benchmark_group("seal");
    for (size, name) in SIZES {
        let body = body(size);
        let aad = Aad::new("stripe", "evt_bench", Column::Body);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("seal", name), &body, |b, body| {
            b.iter(|| ring.seal(black_box(&aad), black_box(body)).unwrap());
        });
        let sealed = ring.seal(&aad, &body).unwrap();
        group.bench_with_input(BenchmarkId::new("open", name), &sealed, |b, sealed| {
            b.iter(|| {
                let aad = Aad::new("stripe", "evt_bench", Column::Body);
                ring.open(black_box(&aad), black_box(sealed)).unwrap()
            });
        });
        group.bench_with_input(
            BenchmarkId::new("open-older-key", name),
            &sealed,
            |b, sealed| {
                b.iter(|| {
                    let aad = Aad::new("stripe", "evt_bench", Column::Body);
                    rotated.open(black_box(&aad), black_box(sealed)).unwrap()
                });
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = seal_and_open
}
criterion_main!(benches);
