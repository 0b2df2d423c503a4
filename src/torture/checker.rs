//! An independent checker for a recorded run: replays the event log per
//! resource and cross-checks it against the final database state and the
//! clients' own history of what was acknowledged to them.
//!
//! It trusts nothing the server computed: it only reads what was written.

use std::collections::{BTreeMap, HashMap, HashSet};

/// One row of the event log.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    pub id: i64,
    /// Database-clock time, Unix milliseconds.
    pub at_ms: i64,
    pub kind: String,
    pub resource: String,
    pub token: Option<i64>,
    pub detail: serde_json::Value,
}

/// One row of the leases table at the end of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRecord {
    pub lease_id: String,
    pub resource: String,
    pub token: i64,
    pub holder: String,
    pub state: String,
}

/// The fenced value of a resource at the end of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueRecord {
    pub resource: String,
    pub token: i64,
    pub version: i64,
    pub value: serde_json::Value,
}

/// An operation a client saw acknowledged (2xx). Failed operations are not
/// listed, and timeouts ("unknown") may or may not have happened, so they
/// constrain nothing.
#[derive(Debug, Clone, PartialEq)]
pub enum Acked {
    Acquire {
        resource: String,
        token: i64,
        lease_id: String,
        holder: String,
    },
    Renew {
        resource: String,
        token: i64,
        expires_at: String,
    },
    Write {
        resource: String,
        token: i64,
        version: i64,
        payload: serde_json::Value,
    },
    Release {
        lease_id: String,
    },
}

#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub events_by_kind: BTreeMap<String, usize>,
}

impl Report {
    pub fn count(&self, kind: &str) -> usize {
        self.events_by_kind.get(kind).copied().unwrap_or(0)
    }

    fn violation(&mut self, v: String) {
        self.violations.push(v);
    }
}

#[derive(Default)]
struct Replay {
    live: Option<i64>,
    last_issued: i64,
    last_accepted: i64,
    last_end_ms: Option<i64>,
    ended: HashSet<i64>,
}

/// Replays the log: tokens strictly increasing per resource, never two live
/// leases (in order and in database time), each lease ended once, writes
/// accepted only for the live lease and never below an accepted token, and
/// no event recorded twice.
pub fn check_events(events: &[EventRecord], report: &mut Report) {
    let mut replays: HashMap<&str, Replay> = HashMap::new();
    let mut last_id = i64::MIN;
    for e in events {
        if e.id <= last_id {
            report.violation(format!("event {} out of id order or recorded twice", e.id));
        }
        last_id = e.id;
        *report.events_by_kind.entry(e.kind.clone()).or_default() += 1;
        let token = e.token.unwrap_or(0);
        let here = format!("event {} ({} {} #{token})", e.id, e.kind, e.resource);
        let r = replays.entry(e.resource.as_str()).or_default();
        match e.kind.as_str() {
            "acquired" => {
                if token <= r.last_issued {
                    report.violation(format!(
                        "{here}: token not above the last issued {}",
                        r.last_issued
                    ));
                }
                if let Some(live) = r.live {
                    report.violation(format!("{here}: granted while #{live} is still live"));
                }
                if let Some(end) = r.last_end_ms.filter(|end| e.at_ms < *end) {
                    report.violation(format!(
                        "{here}: granted {} ms before the previous lease ended",
                        end - e.at_ms
                    ));
                }
                r.last_issued = r.last_issued.max(token);
                r.live = Some(token);
            }
            "renewed" => {
                if r.live != Some(token) {
                    report.violation(format!(
                        "{here}: renewal of a lease that is not live (live: {:?})",
                        r.live
                    ));
                }
            }
            "released" | "expired" | "force_released" => {
                if !r.ended.insert(token) {
                    report.violation(format!("{here}: lease ended twice"));
                }
                if r.live == Some(token) {
                    r.live = None;
                    r.last_end_ms = Some(e.at_ms);
                } else {
                    report.violation(format!(
                        "{here}: ending a lease that is not live (live: {:?})",
                        r.live
                    ));
                }
            }
            "write_accepted" => {
                if r.live != Some(token) {
                    report.violation(format!(
                        "{here}: write accepted for a lease that is not live (live: {:?})",
                        r.live
                    ));
                }
                if token < r.last_accepted {
                    report.violation(format!(
                        "{here}: accepted below the accepted token {}",
                        r.last_accepted
                    ));
                }
                r.last_accepted = r.last_accepted.max(token);
            }
            "write_rejected" => {
                if r.live == Some(token) && token >= r.last_accepted && token <= r.last_issued {
                    report.violation(format!("{here}: the live, current token was rejected"));
                }
            }
            other => report.violation(format!("event {}: unknown kind {other}", e.id)),
        }
    }
}

/// The log agrees with the final state of every lease: one `acquired`
/// event each, exactly one ending event matching its state (none if active).
pub fn check_leases(events: &[EventRecord], leases: &[LeaseRecord], report: &mut Report) {
    let mut acquired: HashMap<(&str, i64), usize> = HashMap::new();
    let mut endings: HashMap<(&str, i64), Vec<&str>> = HashMap::new();
    for e in events {
        let key = (e.resource.as_str(), e.token.unwrap_or(0));
        match e.kind.as_str() {
            "acquired" => *acquired.entry(key).or_default() += 1,
            "released" | "expired" | "force_released" => {
                endings.entry(key).or_default().push(&e.kind)
            }
            _ => {}
        }
    }
    let mut seen = HashSet::new();
    for l in leases {
        let key = (l.resource.as_str(), l.token);
        if !seen.insert(key) {
            report.violation(format!(
                "{} #{}: two lease rows with one token",
                l.resource, l.token
            ));
        }
        if acquired.get(&key).copied().unwrap_or(0) != 1 {
            report.violation(format!(
                "{} #{}: {} acquired events",
                l.resource,
                l.token,
                acquired.get(&key).copied().unwrap_or(0)
            ));
        }
        let ends = endings.get(&key).cloned().unwrap_or_default();
        let ok = match l.state.as_str() {
            "active" => ends.is_empty(),
            state => ends == [state],
        };
        if !ok {
            report.violation(format!(
                "{} #{}: state {} but ending events {ends:?}",
                l.resource, l.token, l.state
            ));
        }
    }
    for key in acquired.keys() {
        if !seen.contains(key) {
            report.violation(format!(
                "{} #{}: acquired event without a lease row",
                key.0, key.1
            ));
        }
    }
}

/// Nothing acknowledged to a client is contradicted by the database:
/// granted leases exist (and no token was granted to two different leases),
/// acknowledged writes and renewals are in the log, the latest acknowledged
/// write per resource is not lost, and acknowledged releases are released.
pub fn check_acknowledged(
    acked: &[Acked],
    events: &[EventRecord],
    leases: &[LeaseRecord],
    values: &[ValueRecord],
    report: &mut Report,
) {
    let lease_by_token: HashMap<(&str, i64), &LeaseRecord> = leases
        .iter()
        .map(|l| ((l.resource.as_str(), l.token), l))
        .collect();
    let lease_by_id: HashMap<&str, &LeaseRecord> =
        leases.iter().map(|l| (l.lease_id.as_str(), l)).collect();
    let accepted_versions: HashSet<(&str, i64, i64)> = events
        .iter()
        .filter(|e| e.kind == "write_accepted")
        .filter_map(|e| {
            Some((
                e.resource.as_str(),
                e.token?,
                e.detail.get("version")?.as_i64()?,
            ))
        })
        .collect();
    let renewals: HashSet<(&str, i64, &str)> = events
        .iter()
        .filter(|e| e.kind == "renewed")
        .filter_map(|e| {
            Some((
                e.resource.as_str(),
                e.token?,
                e.detail.get("expires_at")?.as_str()?,
            ))
        })
        .collect();
    let value_of: HashMap<&str, &ValueRecord> =
        values.iter().map(|v| (v.resource.as_str(), v)).collect();
    let mut granted: HashMap<(&str, i64), &str> = HashMap::new();
    let mut newest_write: HashMap<&str, (i64, &serde_json::Value)> = HashMap::new();
    for a in acked {
        match a {
            Acked::Acquire {
                resource,
                token,
                lease_id,
                holder,
            } => {
                if let Some(other) = granted.insert((resource, *token), lease_id) {
                    if other != lease_id {
                        report.violation(format!(
                            "{resource} #{token}: granted to two different leases"
                        ));
                    }
                }
                match lease_by_token.get(&(resource.as_str(), *token)) {
                    Some(l) if &l.lease_id == lease_id && &l.holder == holder => {}
                    Some(_) => report.violation(format!(
                        "{resource} #{token}: acknowledged lease differs from the stored one"
                    )),
                    None => report.violation(format!(
                        "{resource} #{token}: acknowledged acquire is not in the database"
                    )),
                }
            }
            Acked::Renew {
                resource,
                token,
                expires_at,
            } => {
                if !renewals.contains(&(resource.as_str(), *token, expires_at.as_str())) {
                    report.violation(format!("{resource} #{token}: acknowledged renewal to {expires_at} is not in the log"));
                }
            }
            Acked::Write {
                resource,
                token,
                version,
                payload,
            } => {
                if !accepted_versions.contains(&(resource.as_str(), *token, *version)) {
                    report.violation(format!(
                        "{resource} #{token}: acknowledged write v{version} is not in the log"
                    ));
                }
                let newest = newest_write.entry(resource).or_insert((*version, payload));
                if *version >= newest.0 {
                    *newest = (*version, payload);
                }
            }
            Acked::Release { lease_id } => match lease_by_id.get(lease_id.as_str()) {
                Some(l) if l.state == "released" => {}
                Some(l) => report.violation(format!(
                    "{} #{}: acknowledged release but state {}",
                    l.resource, l.token, l.state
                )),
                None => report.violation(
                    "acknowledged release of a lease that is not in the database".into(),
                ),
            },
        }
    }
    for (resource, (version, payload)) in newest_write {
        match value_of.get(resource) {
            Some(v) if v.version > version => {}
            Some(v) if v.version == version && &v.value == payload => {}
            Some(v) => report.violation(format!(
                "{resource}: acknowledged write v{version} lost (stored v{} {})",
                v.version, v.value
            )),
            None => report.violation(format!(
                "{resource}: acknowledged write v{version} lost (no value stored)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(id: i64, kind: &str, token: i64, at_ms: i64) -> EventRecord {
        EventRecord {
            id,
            at_ms,
            kind: kind.into(),
            resource: "r".into(),
            token: Some(token),
            detail: json!({}),
        }
    }

    fn replay(events: &[EventRecord]) -> Vec<String> {
        let mut report = Report::default();
        check_events(events, &mut report);
        report.violations
    }

    fn lease(token: i64, state: &str) -> LeaseRecord {
        LeaseRecord {
            lease_id: format!("id{token}"),
            resource: "r".into(),
            token,
            holder: "w".into(),
            state: state.into(),
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let h = [
            ev(1, "acquired", 1, 0),
            ev(2, "write_accepted", 1, 1),
            ev(3, "renewed", 1, 2),
            ev(4, "expired", 1, 5),
            ev(5, "write_rejected", 1, 6),
            ev(6, "acquired", 2, 6),
            ev(7, "released", 2, 9),
        ];
        assert_eq!(replay(&h), Vec::<String>::new());
        let mut report = Report::default();
        check_leases(
            &h,
            &[lease(1, "expired"), lease(2, "released")],
            &mut report,
        );
        assert_eq!(report.violations, Vec::<String>::new());
    }

    #[test]
    fn a_reused_token_is_caught() {
        let h = [
            ev(1, "acquired", 1, 0),
            ev(2, "released", 1, 1),
            ev(3, "acquired", 1, 2),
        ];
        assert_eq!(replay(&h).len(), 1);
        let mut report = Report::default();
        let acked = [
            Acked::Acquire {
                resource: "r".into(),
                token: 1,
                lease_id: "a".into(),
                holder: "w".into(),
            },
            Acked::Acquire {
                resource: "r".into(),
                token: 1,
                lease_id: "b".into(),
                holder: "w".into(),
            },
        ];
        check_acknowledged(&acked, &[], &[], &[], &mut report);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("two different leases"))
        );
    }

    #[test]
    fn an_overlap_in_order_or_in_time_is_caught() {
        assert!(
            replay(&[ev(1, "acquired", 1, 0), ev(2, "acquired", 2, 1)])[0].contains("still live")
        );
        let in_time = [
            ev(1, "acquired", 1, 0),
            ev(2, "expired", 1, 50),
            ev(3, "acquired", 2, 20),
        ];
        assert!(replay(&in_time)[0].contains("before the previous lease ended"));
    }

    #[test]
    fn a_duplicate_expiry_or_event_is_caught() {
        let h = [
            ev(1, "acquired", 1, 0),
            ev(2, "expired", 1, 5),
            ev(3, "expired", 1, 5),
        ];
        assert!(replay(&h).iter().any(|v| v.contains("ended twice")));
        let dup = [ev(1, "acquired", 1, 0), ev(1, "acquired", 1, 0)];
        assert!(replay(&dup).iter().any(|v| v.contains("recorded twice")));
        let mut report = Report::default();
        check_leases(&h, &[lease(1, "expired")], &mut report);
        assert!(!report.violations.is_empty());
    }

    #[test]
    fn a_zombie_write_or_a_step_back_is_caught() {
        let zombie = [
            ev(1, "acquired", 1, 0),
            ev(2, "released", 1, 1),
            ev(3, "write_accepted", 1, 2),
        ];
        assert_eq!(replay(&zombie).len(), 1);
        let back = [
            ev(1, "acquired", 2, 0),
            ev(2, "write_accepted", 2, 1),
            ev(3, "released", 2, 2),
            ev(4, "acquired", 3, 3),
            ev(5, "write_accepted", 1, 4),
        ];
        assert!(
            replay(&back)
                .iter()
                .any(|v| v.contains("below the accepted token"))
        );
    }

    #[test]
    fn a_lost_write_or_release_is_caught() {
        let mut accepted = ev(2, "write_accepted", 1, 1);
        accepted.detail = json!({"version": 3});
        let events = [ev(1, "acquired", 1, 0), accepted];
        let write = |version, payload: &str| Acked::Write {
            resource: "r".into(),
            token: 1,
            version,
            payload: json!(payload),
        };
        let stored = ValueRecord {
            resource: "r".into(),
            token: 1,
            version: 3,
            value: json!("p3"),
        };
        let mut report = Report::default();
        check_acknowledged(
            &[write(3, "p3")],
            &events,
            &[lease(1, "active")],
            std::slice::from_ref(&stored),
            &mut report,
        );
        assert_eq!(report.violations, Vec::<String>::new());
        // Acknowledged, but the stored value is an older one.
        let mut report = Report::default();
        let older = ValueRecord {
            version: 2,
            value: json!("p2"),
            ..stored.clone()
        };
        check_acknowledged(
            &[write(3, "p3")],
            &events,
            &[lease(1, "active")],
            &[older],
            &mut report,
        );
        assert!(report.violations.iter().any(|v| v.contains("lost")));
        // Acknowledged, but never logged.
        let mut report = Report::default();
        check_acknowledged(&[write(4, "p4")], &events, &[], &[stored], &mut report);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("not in the log"))
        );
        // Acknowledged release of a lease the database says expired.
        let mut report = Report::default();
        check_acknowledged(
            &[Acked::Release {
                lease_id: "id1".into(),
            }],
            &[],
            &[lease(1, "expired")],
            &[],
            &mut report,
        );
        assert_eq!(report.violations.len(), 1);
    }
}
