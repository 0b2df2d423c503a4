//! Printing results: short text for people, JSON for scripts.

use serde::Serialize;

use crate::client::{Event, LeaseInfo, ResourceInfo};

#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub json: bool,
}

fn time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl Output {
    /// Prints `value` as one line of JSON.
    pub fn json<T: Serialize>(self, value: &T) {
        match serde_json::to_string(value) {
            Ok(text) => println!("{text}"),
            Err(err) => eprintln!("palisade: cannot encode the answer as JSON: {err}"),
        }
    }

    /// A lease, with its secret id when the answer carried one (the
    /// acquirer needs it to renew and release).
    pub fn lease(self, verb: &str, lease: &LeaseInfo) {
        if self.json {
            return self.json(lease);
        }
        println!(
            "{verb} {}: token {}, holder {}, {}, expires at {}",
            lease.resource,
            lease.token,
            lease.holder,
            lease.state,
            time(lease.expires_at)
        );
        if let Some(id) = &lease.lease_id {
            println!("lease id: {id}");
        }
    }

    pub fn resource(self, info: &ResourceInfo) {
        if self.json {
            return self.json(info);
        }
        match &info.holder {
            Some(h) => println!(
                "{}: held by {} with token {} since {}, until {}",
                info.resource,
                h.holder,
                h.token,
                time(h.acquired_at),
                time(h.expires_at)
            ),
            None => println!("{}: free", info.resource),
        }
        println!(
            "last token {}, accepted token {}",
            info.last_token, info.accepted_token
        );
    }

    pub fn event(self, event: &Event) {
        if self.json {
            return self.json(event);
        }
        let mut line = format!(
            "#{} {} {} {}",
            event.id,
            time(event.at),
            event.kind,
            event.resource
        );
        if let Some(token) = event.token {
            line.push_str(&format!(" token={token}"));
        }
        if let Some(holder) = &event.holder {
            line.push_str(&format!(" holder={holder}"));
        }
        if event.detail.as_object().is_some_and(|d| !d.is_empty()) {
            line.push_str(&format!(" {}", event.detail));
        }
        println!("{line}");
    }
}
