//! Integration tests: the real server on a random port, driven over HTTP,
//! on SQLite and (with `PALISADE_TEST_POSTGRES_URL`) PostgreSQL.

mod support;

mod locks;
mod metrics;
mod retention;
