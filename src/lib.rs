//! Palisade: a lock service with fencing tokens.

pub mod app;
pub mod bench;
pub mod cli;
#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "client")]
pub mod commands;
pub mod demo;
pub mod domain;
pub mod http;
pub mod metrics;
pub mod retention;
pub mod service;
pub mod store;
pub mod torture;
pub mod waiters;
