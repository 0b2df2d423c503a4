//! How the UI writes times, durations, links and one-line event summaries.
//! Everything returned here is plain text; templates escape it.

use chrono::{DateTime, Utc};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use crate::domain::EventKind;
use crate::store::Event;

/// Characters left as they are in a path segment or query value.
const KEEP: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');

/// Percent-encodes one path segment or query value.
pub fn enc(text: &str) -> String {
    utf8_percent_encode(text, KEEP).to_string()
}

pub fn resource_href(name: &str) -> String {
    format!("/ui/resources/{}", enc(name))
}

pub fn lease_href(resource: &str, token: i64) -> String {
    format!("/ui/resources/{}/leases/{token}", enc(resource))
}

/// `10:42:13.120` (UTC); the date is shown when it is not `now`'s day.
pub fn clock(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if t.date_naive() == now.date_naive() {
        t.format("%H:%M:%S%.3f").to_string()
    } else {
        t.format("%b %d %H:%M:%S").to_string()
    }
}

/// Full RFC 3339 instant, for tooltips.
pub fn instant(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `850 ms`, `4.2 s`, `3 m 04 s`, `2 h 03 m`, `3 d 4 h`.
pub fn duration_ms(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    let text = match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=59_999 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{} m {:02} s", ms / 60_000, (ms / 1000) % 60),
        3_600_000..=86_399_999 => format!("{} h {:02} m", ms / 3_600_000, (ms / 60_000) % 60),
        _ => format!("{} d {} h", ms / 86_400_000, (ms / 3_600_000) % 24),
    };
    format!("{sign}{text}")
}

/// `12 s ago`; `in 3 s` for the future.
pub fn ago(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let ms = (now - t).num_milliseconds();
    if ms >= 0 {
        format!("{} ago", duration_ms(ms))
    } else {
        format!("in {}", duration_ms(-ms))
    }
}

pub fn kind_label(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Acquired => "acquired",
        EventKind::Renewed => "renewed",
        EventKind::Released => "released",
        EventKind::Expired => "expired",
        EventKind::ForceReleased => "force-released",
        EventKind::WriteAccepted => "write accepted",
        EventKind::WriteRejected => "stale write rejected",
    }
}

fn int(detail: &Value, key: &str) -> Option<i64> {
    detail.get(key).and_then(Value::as_i64)
}

fn text<'a>(detail: &'a Value, key: &str) -> Option<&'a str> {
    detail.get(key).and_then(Value::as_str)
}

/// The lease that fenced a rejected write out: (token, holder).
pub fn fenced_by(detail: &Value) -> Option<(i64, String)> {
    let by = detail.get("fenced_by")?;
    Some((
        by.get("token")?.as_i64()?,
        by.get("holder")?.as_str()?.to_owned(),
    ))
}

/// One line that says what the event's detail means.
pub fn summary(event: &Event) -> String {
    let d = &event.detail;
    match event.kind {
        EventKind::Acquired => match int(d, "ttl_ms") {
            Some(ttl) => format!("ttl {}", duration_ms(ttl)),
            None => String::new(),
        },
        EventKind::Renewed => {
            let mut parts = Vec::new();
            if let Some(margin) = int(d, "margin_ms") {
                parts.push(format!("{} left at renewal", duration_ms(margin)));
            }
            if let Some(ttl) = int(d, "ttl_ms") {
                parts.push(format!("ttl {}", duration_ms(ttl)));
            }
            parts.join(" · ")
        }
        EventKind::Released => int(d, "held_ms")
            .map(|h| format!("held {}", duration_ms(h)))
            .unwrap_or_default(),
        EventKind::Expired => {
            let mut parts = Vec::new();
            if let Some(held) = int(d, "held_ms") {
                parts.push(format!("held {}", duration_ms(held)));
            }
            if let Some(late) = int(d, "noticed_late_ms") {
                parts.push(format!("recorded {} after its deadline", duration_ms(late)));
            }
            parts.join(" · ")
        }
        EventKind::ForceReleased => format!(
            "by {}: “{}”",
            text(d, "by").unwrap_or("?"),
            text(d, "reason").unwrap_or("")
        ),
        EventKind::WriteAccepted => {
            let mut parts = vec![format!("via {}", text(d, "via").unwrap_or("fence"))];
            if let Some(v) = int(d, "version") {
                parts.push(format!("version {v}"));
            }
            parts.join(" · ")
        }
        EventKind::WriteRejected => {
            let mut parts = Vec::new();
            if text(d, "reason") == Some("unknown_token") {
                parts.push("token was never issued".to_owned());
            } else if let Some(accepted) = int(d, "accepted_token") {
                parts.push(format!("accepted token is {accepted}"));
            }
            if let Some((token, holder)) = fenced_by(d) {
                parts.push(format!("fenced out by #{token} ({holder})"));
            }
            if let Some(late) = int(d, "lateness_ms") {
                parts.push(format!("{} after its lease ended", duration_ms(late)));
            }
            parts.join(" · ")
        }
    }
}

/// An event as a table row shows it.
pub struct EventRowView {
    pub id: i64,
    pub at: String,
    pub at_full: String,
    pub kind: &'static str,
    pub kind_label: &'static str,
    pub resource: String,
    pub resource_href: String,
    pub token: Option<i64>,
    pub lease_href: Option<String>,
    pub holder: String,
    pub summary: String,
    /// For a stale write: the lease that fenced it out.
    pub fenced_by: Option<(i64, String, String)>,
}

impl EventRowView {
    pub fn new(event: &Event, now: DateTime<Utc>) -> Self {
        Self {
            id: event.id,
            at: clock(event.at, now),
            at_full: instant(event.at),
            kind: event.kind.as_str(),
            kind_label: kind_label(event.kind),
            resource: event.resource.clone(),
            resource_href: resource_href(&event.resource),
            token: event.token,
            lease_href: event.token.map(|t| lease_href(&event.resource, t)),
            holder: event.holder.clone().unwrap_or_default(),
            summary: summary(event),
            fenced_by: fenced_by(&event.detail)
                .map(|(t, h)| (t, h, lease_href(&event.resource, t))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration_ms(0), "0 ms");
        assert_eq!(duration_ms(850), "850 ms");
        assert_eq!(duration_ms(4_200), "4.2 s");
        assert_eq!(duration_ms(184_000), "3 m 04 s");
        assert_eq!(duration_ms(7_380_000), "2 h 03 m");
        assert_eq!(duration_ms(-1500), "-1.5 s");
    }

    #[test]
    fn encoding_keeps_a_name_in_one_segment() {
        assert_eq!(enc("reports/daily"), "reports%2Fdaily");
        assert_eq!(enc("\"><svg>"), "%22%3E%3Csvg%3E");
        assert_eq!(lease_href("a b", 3), "/ui/resources/a%20b/leases/3");
    }
}
