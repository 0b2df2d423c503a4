//! An independent checker for the event log: replays each resource's events
//! in id order and reports every violation of the lock's promises.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

#[derive(Default)]
struct ResourceHistory {
    live: Option<i64>,
    last_issued: i64,
    last_accepted: i64,
    /// The time the previous lease ended (for overlap in time).
    last_end_at: Option<String>,
    ended: HashSet<i64>,
}

/// What the checker counted, for asserting a run exercised what it claims.
#[derive(Debug, Default)]
pub struct Tally {
    pub by_kind: HashMap<String, usize>,
}

impl Tally {
    pub fn count(&self, kind: &str) -> usize {
        self.by_kind.get(kind).copied().unwrap_or(0)
    }
}

/// Returns the violations found (empty = the history is serial and safe).
pub fn check(events: &[Value]) -> (Vec<String>, Tally) {
    let mut violations = Vec::new();
    let mut tally = Tally::default();
    let mut resources: HashMap<String, ResourceHistory> = HashMap::new();
    let mut seen_ids = HashSet::new();
    let mut last_id = 0;
    for e in events {
        let id = e["id"].as_i64().unwrap_or(-1);
        if !seen_ids.insert(id) {
            violations.push(format!("event {id} appears twice"));
        }
        if id <= last_id {
            violations.push(format!("event {id} out of id order"));
        }
        last_id = id;
        let kind = e["kind"].as_str().unwrap_or("?").to_owned();
        *tally.by_kind.entry(kind.clone()).or_default() += 1;
        let name = e["resource"].as_str().unwrap_or("?").to_owned();
        let token = e["token"].as_i64().unwrap_or(0);
        let at = e["at"].as_str().unwrap_or("").to_owned();
        let r = resources.entry(name.clone()).or_default();
        let here = format!("event {id} ({kind} {name} #{token})");
        match kind.as_str() {
            "acquired" => {
                if token <= r.last_issued {
                    violations.push(format!(
                        "{here}: token not above last issued {}",
                        r.last_issued
                    ));
                }
                if let Some(live) = r.live {
                    violations.push(format!("{here}: granted while #{live} is still live"));
                }
                if let Some(end) = &r.last_end_at {
                    // RFC 3339 with fixed millisecond precision sorts as text.
                    if at < *end {
                        violations.push(format!(
                            "{here}: granted at {at}, before the previous lease ended at {end}"
                        ));
                    }
                }
                r.last_issued = r.last_issued.max(token);
                r.live = Some(token);
            }
            "renewed" => {
                if r.live != Some(token) {
                    violations.push(format!(
                        "{here}: renewal of a lease that is not live (live: {:?})",
                        r.live
                    ));
                }
            }
            "released" | "expired" | "force_released" => {
                if !r.ended.insert(token) {
                    violations.push(format!("{here}: lease ended twice"));
                }
                if r.live != Some(token) {
                    violations.push(format!(
                        "{here}: ending a lease that is not live (live: {:?})",
                        r.live
                    ));
                } else {
                    r.live = None;
                    r.last_end_at = Some(at);
                }
            }
            "write_accepted" => {
                if r.live != Some(token) {
                    violations.push(format!(
                        "{here}: write accepted for a lease that is not live (live: {:?})",
                        r.live
                    ));
                }
                if token < r.last_accepted {
                    violations.push(format!(
                        "{here}: accepted below the accepted token {}",
                        r.last_accepted
                    ));
                }
                r.last_accepted = r.last_accepted.max(token);
            }
            "write_rejected" => {
                let fair =
                    token > r.last_issued || token < r.last_accepted || r.live != Some(token);
                if !fair {
                    violations.push(format!("{here}: a live, current token was rejected"));
                }
            }
            other => violations.push(format!("event {id}: unknown kind {other}")),
        }
    }
    (violations, tally)
}

#[cfg(test)]
mod planted_violations {
    use super::check;
    use serde_json::{Value, json};

    fn ev(id: i64, kind: &str, token: i64, at_ms: i64) -> Value {
        json!({"id": id, "kind": kind, "resource": "r", "token": token,
               "at": format!("2026-12-02T10:00:00.{at_ms:03}Z")})
    }

    fn violations(events: &[Value]) -> Vec<String> {
        check(events).0
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
        assert_eq!(violations(&h), Vec::<String>::new());
    }

    #[test]
    fn a_reused_token_is_caught() {
        let h = [
            ev(1, "acquired", 1, 0),
            ev(2, "released", 1, 1),
            ev(3, "acquired", 1, 2),
        ];
        assert_eq!(violations(&h).len(), 1);
    }

    #[test]
    fn an_overlap_is_caught() {
        let h = [ev(1, "acquired", 1, 0), ev(2, "acquired", 2, 1)];
        assert!(violations(&h)[0].contains("still live"));
        let in_time = [
            ev(1, "acquired", 1, 0),
            ev(2, "expired", 1, 50),
            ev(3, "acquired", 2, 20),
        ];
        assert!(violations(&in_time)[0].contains("before the previous lease ended"));
    }

    #[test]
    fn a_duplicate_expiry_is_caught() {
        let h = [
            ev(1, "acquired", 1, 0),
            ev(2, "expired", 1, 5),
            ev(3, "expired", 1, 5),
        ];
        assert!(violations(&h).iter().any(|v| v.contains("ended twice")));
    }

    #[test]
    fn a_zombie_write_or_a_step_back_is_caught() {
        let zombie = [
            ev(1, "acquired", 1, 0),
            ev(2, "released", 1, 1),
            ev(3, "write_accepted", 1, 2),
        ];
        assert_eq!(violations(&zombie).len(), 1);
        let back = [
            ev(1, "acquired", 2, 0),
            ev(2, "write_accepted", 2, 1),
            ev(3, "released", 2, 2),
            ev(4, "acquired", 3, 3),
            ev(5, "write_accepted", 1, 4),
        ];
        assert!(
            violations(&back)
                .iter()
                .any(|v| v.contains("below the accepted token"))
        );
    }

    #[test]
    fn a_duplicated_event_is_caught() {
        let h = [ev(1, "acquired", 1, 0), ev(1, "acquired", 1, 0)];
        assert!(violations(&h).iter().any(|v| v.contains("twice")));
    }
}
