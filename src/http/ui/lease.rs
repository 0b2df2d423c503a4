//! One lease's story (`/ui/resources/{name}/leases/{token}`): its events,
//! renewals with the margin left at each, its writes, stale writes it tried
//! after it ended, and how it ended.

use askama::Template;
use axum::Extension;
use axum::extract::{Path, State};
use axum::response::Response;
use chrono::Duration;

use super::format::{
    EventRowView, clock, duration_ms, fenced_by, instant, lease_href, resource_href,
};
use super::timeline::{Timeline, TimelineInput, build};
use super::{UiError, Viewer, render, resource_name};
use crate::domain::{EventKind, LeaseState};
use crate::http::AppState;
use crate::store::ui::EventQuery;

pub struct RenewalView {
    pub at: String,
    pub margin: String,
    /// Under a fifth of the TTL was left: a close call.
    pub tight: bool,
    pub ttl: String,
}

#[derive(Template)]
#[template(path = "lease.html")]
pub struct LeasePage {
    pub viewer: Viewer,
    pub resource: String,
    pub resource_href: String,
    pub token: i64,
    pub holder: String,
    pub state: &'static str,
    pub state_label: &'static str,
    pub acquired: String,
    pub acquired_full: String,
    pub ended: Option<String>,
    pub held_for: String,
    pub ttl: String,
    pub ending: String,
    pub renewals: Vec<RenewalView>,
    pub writes: Vec<EventRowView>,
    pub stale_writes: Vec<EventRowView>,
    pub events: Vec<EventRowView>,
    pub previous_href: Option<String>,
    pub fenced_by: Option<(i64, String, String)>,
    pub timeline: Timeline,
}

pub async fn page(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    Path((raw_name, token)): Path<(String, String)>,
) -> Result<Response, UiError> {
    let name = resource_name(raw_name)?;
    let token: i64 = token
        .parse()
        .ok()
        .filter(|t| *t >= 1)
        .ok_or_else(|| UiError::bad_request("a token is a whole number from 1"))?;
    let lease = state
        .service
        .public_lease(&name, token)
        .await?
        .ok_or_else(|| UiError::not_found("this resource never issued that token"))?;
    let now = state.service.db_now().await?;
    let mut events = state
        .service
        .query_events(&EventQuery {
            resource: Some(name.as_str().to_owned()),
            token: Some(token),
            limit: 1000,
            ..EventQuery::default()
        })
        .await?;
    events.reverse();
    let lease_state = lease.state_at(now);
    let ended_at = lease.ended_at_as_of(now);
    let ending_event = events.iter().find(|e| e.kind.ends_lease());
    let ending = match (lease_state, ending_event) {
        (LeaseState::Active, _) => format!(
            "Still active: {} left before its deadline.",
            duration_ms((lease.expires_at - now).num_milliseconds())
        ),
        (_, Some(e)) => format!(
            "{} — {}",
            super::format::kind_label(e.kind),
            super::format::summary(e)
        ),
        (LeaseState::Expired, None) => "Expired: its deadline passed without a renewal.".to_owned(),
        (other, None) => other.as_str().to_owned(),
    };
    let renewals = events
        .iter()
        .filter(|e| e.kind == EventKind::Renewed)
        .map(|e| {
            let margin = e
                .detail
                .get("margin_ms")
                .and_then(|v| v.as_i64())
                .unwrap_or(0);
            let ttl = e
                .detail
                .get("ttl_ms")
                .and_then(|v| v.as_i64())
                .unwrap_or(lease.ttl_ms);
            RenewalView {
                at: clock(e.at, now),
                margin: duration_ms(margin),
                tight: margin * 5 < ttl,
                ttl: duration_ms(ttl),
            }
        })
        .collect();
    let stale: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::WriteRejected)
        .collect();
    let fenced = stale
        .iter()
        .find_map(|e| fenced_by(&e.detail))
        .map(|(t, h)| (t, h, lease_href(name.as_str(), t)));
    let end_or_now = ended_at.unwrap_or(now).max(lease.expires_at.min(now));
    let last_seen = events.last().map_or(end_or_now, |e| e.at.max(end_or_now));
    let pad =
        Duration::milliseconds(((last_seen - lease.acquired_at).num_milliseconds() / 8).max(1_000));
    let (from, to) = (lease.acquired_at - pad, last_seen + pad);
    let around = state.service.leases_in_window(&name, from, to, 50).await?;
    let marks: Vec<_> = events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                EventKind::Renewed | EventKind::WriteAccepted | EventKind::WriteRejected
            )
        })
        .cloned()
        .collect();
    let timeline = build(&TimelineInput {
        resource: name.as_str(),
        from,
        to,
        now,
        leases: &around,
        leases_truncated: false,
        marks: &marks,
        marks_truncated: false,
    });
    let page = LeasePage {
        viewer,
        resource: name.as_str().to_owned(),
        resource_href: resource_href(name.as_str()),
        token,
        holder: lease.holder.clone(),
        state: lease_state.as_str(),
        state_label: match lease_state {
            LeaseState::Active => "active",
            LeaseState::Released => "released",
            LeaseState::Expired => "expired",
            LeaseState::ForceReleased => "force-released",
        },
        acquired: clock(lease.acquired_at, now),
        acquired_full: instant(lease.acquired_at),
        ended: ended_at.map(|t| clock(t, now)),
        held_for: duration_ms((ended_at.unwrap_or(now) - lease.acquired_at).num_milliseconds()),
        ttl: duration_ms(lease.ttl_ms),
        ending,
        renewals,
        writes: events
            .iter()
            .filter(|e| e.kind == EventKind::WriteAccepted)
            .map(|e| EventRowView::new(e, now))
            .collect(),
        stale_writes: stale.iter().map(|e| EventRowView::new(e, now)).collect(),
        events: events.iter().map(|e| EventRowView::new(e, now)).collect(),
        previous_href: (token > 1).then(|| lease_href(name.as_str(), token - 1)),
        fenced_by: fenced,
        timeline,
    };
    Ok(render(&page))
}
