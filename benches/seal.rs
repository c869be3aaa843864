//! The per-call cost of sealing and opening a body (issue 34, `docs/design/
//! payload-protection.md` §11): `KeyRing::seal` (LZ4 when it shortens the payload, a
//! random 192-bit nonce and XChaCha20-Poly1305 under the current key) and `KeyRing::open`
//! of what it sealed, at 1 KiB and 64 KiB — what a sealed accept adds on the request's
//! task and a claim on the worker's, per body — for two bodies: `json` (invoice lines with
//! random ids and amounts, compressing about as real payloads do) and `random` (random
//! base64 letters, which LZ4 cannot shorten: compression tried and given up).
//!
//! - `seal/<body>-<size>`: one body sealed, compressed first when that shortens it.
//! - `seal-uncompressed/<body>-<size>`: the same with `KeyRing::without_compression`.
//! - `open/<body>-<size>`: what `seal` made, opened (the associated data rebuilt per call,
//!   as a store rebuilds it from the row).
//! - `open-older-key/json-<size>`: opened with the sealing key second in a ring of three
//!   (after a rotation, before rekey): the key found by id, so about the same.
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

/// xorshift64: the benchmark's bodies are the same every run.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// `size` bytes of invoice lines, like (not the same as) `benches/throughput/presign.py`'s
/// `PAD=json`.
fn json(size: usize) -> Vec<u8> {
    const WORDS: [&str; 8] = [
        "annual", "monthly", "seat", "storage", "plan", "pro", "team", "tax",
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15;
    let mut body = br#"{"id":"evt_bench","type":"invoice.paid","data":{"lines":["#.to_vec();
    loop {
        let r = next(&mut state);
        let line = format!(
            r#"{{"id":"il_{:016x}","amount":{},"currency":"usd","description":"{} {}","quantity":{}}},"#,
            next(&mut state),
            r % 1_000_000,
            WORDS[(r >> 20) as usize % 8],
            WORDS[(r >> 24) as usize % 8],
            (r >> 32) % 50
        );
        if body.len() + line.len() + 4 > size {
            break;
        }
        body.extend_from_slice(line.as_bytes());
    }
    body.pop();
    body.extend_from_slice(b"]}}");
    body.resize(size, b' ');
    body
}

/// `size` random base64 letters.
fn random(size: usize) -> Vec<u8> {
    const LETTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut state = 0x2545_F491_4F6C_DD1D;
    (0..size)
        .map(|_| LETTERS[(next(&mut state) >> 58) as usize])
        .collect()
}

fn seal_and_open(c: &mut Criterion) {
    let ring = KeyRing::new([key("k1", 1)]).unwrap();
    let uncompressed = ring.clone().without_compression();
    let rotated = KeyRing::new([key("k2", 2), key("k1", 1), key("k0", 0)]).unwrap();
    let aad = Aad::new("stripe", "evt_bench", Column::Body);
    let mut group = c.benchmark_group("seal");
    for (size, size_name) in SIZES {
        for (kind, body) in [("json", json(size)), ("random", random(size))] {
            let name = format!("{kind}-{size_name}");
            group.throughput(Throughput::Bytes(size as u64));
            for (bench, ring) in [("seal", &ring), ("seal-uncompressed", &uncompressed)] {
                group.bench_with_input(BenchmarkId::new(bench, &name), &body, |b, body| {
                    b.iter(|| ring.seal(black_box(&aad), black_box(body)).unwrap());
                });
            }
            let sealed = ring.seal(&aad, &body).unwrap();
            println!(
                "{name}: sealed {} bytes of {size}",
                sealed.ciphertext().len()
            );
            let mut opens = vec![("open", &ring)];
            if kind == "json" {
                opens.push(("open-older-key", &rotated));
            }
            for (bench, ring) in opens {
                group.bench_with_input(BenchmarkId::new(bench, &name), &sealed, |b, sealed| {
                    b.iter(|| {
                        let aad = Aad::new("stripe", "evt_bench", Column::Body);
                        ring.open(black_box(&aad), black_box(sealed)).unwrap()
                    });
                });
            }
        }
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
