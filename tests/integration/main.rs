//! Integration tests: the real server on a random port, driven over HTTP,
//! on SQLite and (with `PALISADE_TEST_POSTGRES_URL`) PostgreSQL.

// Tests may fail loudly on anything unexpected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod api_keys;
mod bad_input;
mod bench;
mod browser;
#[cfg(feature = "client")]
mod cli;
#[cfg(feature = "client")]
mod client;
mod concurrency;
mod demo;
mod deploy_files;
mod fairness;
mod fencing;
mod group_commit;
mod history;
mod hostile_clients;
mod lifecycle;
mod limits;
mod locks;
mod metrics;
mod openapi;
mod prometheus_e2e;
#[cfg(feature = "client")]
mod recipes;
mod repack;
mod restart;
mod retention;
mod ui;
