//! The clients' history: one JSON line per invocation and per completion,
//! with timestamps. A timeout is `unknown`: the operation may or may not
//! have happened, so the checker lets it constrain nothing.

use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::checker::Acked;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Invoke,
    Ok,
    Fail,
    Unknown,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub worker: String,
    pub op: String,
    pub phase: Phase,
    /// Local wall clock, Unix milliseconds (for reading the log; the checker
    /// never compares it with database time).
    pub t_ms: i64,
    pub resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// The error code or transport error of a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Entry {
    pub fn new(worker: &str, op: &str, phase: Phase, resource: &str) -> Self {
        Self {
            worker: worker.to_owned(),
            op: op.to_owned(),
            phase,
            t_ms: chrono::Utc::now().timestamp_millis(),
            resource: resource.to_owned(),
            token: None,
            lease_id: None,
            holder: None,
            version: None,
            expires_at: None,
            payload: None,
            error: None,
        }
    }

    /// The acknowledged operation this completion proves, if any.
    pub fn acked(&self) -> Option<Acked> {
        if self.phase != Phase::Ok {
            return None;
        }
        match self.op.as_str() {
            "acquire" => Some(Acked::Acquire {
                resource: self.resource.clone(),
                token: self.token?,
                lease_id: self.lease_id.clone()?,
                holder: self.holder.clone()?,
            }),
            "renew" => Some(Acked::Renew {
                resource: self.resource.clone(),
                token: self.token?,
                expires_at: self.expires_at.clone()?,
            }),
            "write" => Some(Acked::Write {
                resource: self.resource.clone(),
                token: self.token?,
                version: self.version?,
                payload: self.payload.clone()?,
            }),
            "release" => Some(Acked::Release {
                lease_id: self.lease_id.clone()?,
            }),
            _ => None,
        }
    }
}

/// Appends entries to a history file, one flushed line each, so a worker
/// that is killed loses nothing it had already logged.
pub struct HistoryWriter {
    file: std::fs::File,
}

impl HistoryWriter {
    pub fn create(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            file: std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        })
    }

    pub fn log(&mut self, entry: &Entry) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)
    }
}

/// Reads every history file in `dir`.
pub fn read_all(dir: &Path) -> std::io::Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for file in std::fs::read_dir(dir)? {
        let path = file?.path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            let reader = std::io::BufReader::new(std::fs::File::open(&path)?);
            for line in reader.lines() {
                let line = line?;
                // A torn last line (a worker killed mid-write) is skipped.
                if let Ok(entry) = serde_json::from_str::<Entry>(&line) {
                    entries.push(entry);
                }
            }
        }
    }
    Ok(entries)
}
