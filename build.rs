//! Rebuilds the crate when a migration changes: `sqlx::migrate!` embeds `migrations/` at
//! compile time, and Cargo does not know the crate reads that directory.

fn main() {
    // A directory: Cargo reruns this (and so rebuilds the crate) when any file in it
    // changes, is added or is removed.
    println!("cargo:rerun-if-changed=migrations");
}
