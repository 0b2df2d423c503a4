//! Marks the PostgreSQL tests `ignored` (with the reason) when the suite has
//! no PostgreSQL to run against, so a local `cargo test` reports them as not
//! run instead of as passed. In CI (`CI` set) they are never ignored: there
//! a missing `PALISADE_TEST_POSTGRES_URL` fails them.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PALISADE_TEST_POSTGRES_URL");
    println!("cargo::rerun-if-env-changed=CI");
    println!("cargo::rustc-check-cfg=cfg(palisade_no_test_postgres)");
    let configured = std::env::var("PALISADE_TEST_POSTGRES_URL").is_ok_and(|v| !v.is_empty());
    let in_ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
    if !configured && !in_ci {
        println!("cargo::rustc-cfg=palisade_no_test_postgres");
    }
}
