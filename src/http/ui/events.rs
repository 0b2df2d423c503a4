//! The global event stream (`/ui/events`), newest first, filterable by
//! kind, resource prefix and holder, with a "stale writes only" view. Live:
//! the table polls with the newest id it shows and is redrawn only when
//! something newer exists.

use askama::Template;
use axum::Extension;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;

use super::format::{EventRowView, enc, kind_label};
use super::{UiError, Viewer, is_htmx, no_change, render};
use crate::domain::EventKind;
use crate::http::AppState;
use crate::store::ui::EventQuery;

const PAGE_SIZE: i64 = 100;

pub struct KindOption {
    pub value: &'static str,
    pub label: &'static str,
    pub selected: bool,
}

#[derive(Template)]
#[template(path = "events.html", blocks = ["table"])]
pub struct EventsPage {
    pub viewer: Viewer,
    pub kinds: Vec<KindOption>,
    pub stale_only: bool,
    pub prefix: String,
    pub holder: String,
    pub events: Vec<EventRowView>,
    pub older_href: Option<String>,
    pub newest_href: Option<String>,
    pub live_href: Option<String>,
    pub filtered: bool,
}

#[derive(Deserialize, Default)]
pub struct EventsQuery {
    kind: Option<String>,
    prefix: Option<String>,
    holder: Option<String>,
    before: Option<String>,
    cursor: Option<i64>,
}

pub async fn page(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    headers: HeaderMap,
    Query(q): Query<EventsQuery>,
) -> Result<Response, UiError> {
    let kind_text = q.kind.unwrap_or_default();
    let kind = match kind_text.as_str() {
        "" => None,
        "stale" => Some(EventKind::WriteRejected),
        other => Some(
            other
                .parse::<EventKind>()
                .map_err(|e| UiError::bad_request(e.to_string()))?,
        ),
    };
    let before = match q.before.as_deref().filter(|b| !b.is_empty()) {
        None => None,
        Some(b) => Some(
            b.parse::<i64>()
                .map_err(|_| UiError::bad_request("before must be an event id"))?,
        ),
    };
    let prefix = q.prefix.unwrap_or_default();
    let holder = q.holder.unwrap_or_default();
    if prefix.len() > 255 || holder.len() > 255 {
        return Err(UiError::bad_request("filters are at most 255 bytes"));
    }
    let query = EventQuery {
        resource_prefix: Some(prefix.clone()).filter(|p| !p.is_empty()),
        kinds: kind.into_iter().collect(),
        holder: Some(holder.clone()).filter(|h| !h.is_empty()),
        before,
        limit: PAGE_SIZE,
        ..EventQuery::default()
    };
    let htmx = is_htmx(&headers);
    if htmx && before.is_none() {
        if let Some(cursor) = q.cursor {
            let newest = state
                .service
                .query_events(&EventQuery {
                    limit: 1,
                    ..query.clone()
                })
                .await?;
            if newest.first().map_or(0, |e| e.id) <= cursor {
                return Ok(no_change());
            }
        }
    }
    let events = state.service.query_events(&query).await?;
    let now = state.service.db_now().await?;
    let filters = format!(
        "kind={}&prefix={}&holder={}",
        enc(&kind_text),
        enc(&prefix),
        enc(&holder)
    );
    let top = events.first().map_or(0, |e| e.id);
    let page = EventsPage {
        viewer,
        kinds: EventKind::ALL
            .iter()
            .map(|k| KindOption {
                value: k.as_str(),
                label: kind_label(*k),
                selected: kind_text == k.as_str(),
            })
            .collect(),
        stale_only: kind_text == "stale",
        older_href: (events.len() as i64 == PAGE_SIZE)
            .then(|| {
                events
                    .last()
                    .map(|e| format!("/ui/events?{filters}&before={}", e.id))
            })
            .flatten(),
        newest_href: before.map(|_| format!("/ui/events?{filters}")),
        live_href: before
            .is_none()
            .then(|| format!("/ui/events?{filters}&cursor={top}")),
        filtered: !kind_text.is_empty() || !prefix.is_empty() || !holder.is_empty(),
        prefix,
        holder,
        events: events.iter().map(|e| EventRowView::new(e, now)).collect(),
    };
    Ok(if htmx {
        render(&page.as_table())
    } else {
        render(&page)
    })
}
