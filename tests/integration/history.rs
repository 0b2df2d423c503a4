//! Runs the library's independent history checker over events fetched
//! through the API.

use palisade::torture::checker::{self, EventRecord, Report};
use serde_json::Value;

fn record(e: &Value) -> EventRecord {
    let at = e["at"].as_str().unwrap_or_default();
    EventRecord {
        id: e["id"].as_i64().unwrap_or(-1),
        at_ms: chrono::DateTime::parse_from_rfc3339(at)
            .map(|t| t.timestamp_millis())
            .unwrap_or(i64::MIN),
        kind: e["kind"].as_str().unwrap_or("?").to_owned(),
        resource: e["resource"].as_str().unwrap_or("?").to_owned(),
        token: e["token"].as_i64(),
        detail: e["detail"].clone(),
    }
}

/// Returns the violations found in `events` and a tally by kind.
pub fn check(events: &[Value]) -> (Vec<String>, Report) {
    let records: Vec<EventRecord> = events.iter().map(record).collect();
    let mut report = Report::default();
    checker::check_events(&records, &mut report);
    (std::mem::take(&mut report.violations), report)
}
