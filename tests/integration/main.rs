//! Integration tests: the real server on a random port, driven over HTTP,
//! on SQLite and (with `PALISADE_TEST_POSTGRES_URL`) PostgreSQL.

// Tests may fail loudly on anything unexpected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod bad_input;
mod bench;
mod concurrency;
mod fairness;
mod fencing;
mod group_commit;
mod history;
mod lifecycle;
mod locks;
mod metrics;
mod restart;
mod retention;
