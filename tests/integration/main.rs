//! Integration tests: the real server on a random port, driven over HTTP,
//! on SQLite and (with `PALISADE_TEST_POSTGRES_URL`) PostgreSQL.

// Tests may fail loudly on anything unexpected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod bad_input;
mod browser;
mod concurrency;
mod demo;
mod deploy_files;
mod fencing;
mod history;
mod lifecycle;
mod limits;
mod locks;
mod metrics;
mod prometheus_e2e;
mod restart;
mod retention;
mod ui;
