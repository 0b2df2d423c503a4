//! The resource list (`/ui/resources`): state, holder, token and time left
//! for every resource; filter by name prefix and state, sort, page.

use askama::Template;
use axum::Extension;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;

use super::format::{ago, duration_ms, enc, instant, resource_href};
use super::{UiError, Viewer, is_htmx, render};
use crate::http::AppState;
use crate::store::ui::{HeldFilter, ResourceOrder, ResourceQuery};

const PAGE_SIZE: i64 = 50;

pub struct ResourceRowView {
    pub name: String,
    pub href: String,
    pub held: bool,
    pub holder: String,
    pub token: Option<i64>,
    pub lease_href: Option<String>,
    pub time_left: String,
    /// Share of the TTL still left, 0–100, for the little gauge.
    pub left_pct: i64,
    pub last_activity: String,
    pub last_activity_full: String,
    pub last_token: i64,
    pub accepted_token: i64,
}

#[derive(Template)]
#[template(path = "resources.html", blocks = ["table"])]
pub struct ResourcesPage {
    pub viewer: Viewer,
    pub prefix: String,
    pub state: &'static str,
    pub sort: &'static str,
    pub rows: Vec<ResourceRowView>,
    pub total: i64,
    pub page: i64,
    pub pages: i64,
    pub first_row: i64,
    pub last_row: i64,
    /// The current query string without `page`, for links.
    pub base_query: String,
    pub self_url: String,
}

#[derive(Deserialize, Default)]
pub struct ResourcesQuery {
    prefix: Option<String>,
    state: Option<String>,
    sort: Option<String>,
    page: Option<String>,
}

pub async fn page(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    headers: HeaderMap,
    Query(q): Query<ResourcesQuery>,
) -> Result<Response, UiError> {
    let (held, state_name) = match q.state.as_deref().unwrap_or("") {
        "" | "any" => (HeldFilter::Any, "any"),
        "held" => (HeldFilter::Held, "held"),
        "free" => (HeldFilter::Free, "free"),
        _ => return Err(UiError::bad_request("state must be any, held or free")),
    };
    let (order, sort_name) = match q.sort.as_deref().unwrap_or("") {
        "" | "activity" => (ResourceOrder::Activity, "activity"),
        "oldest" => (ResourceOrder::ActivityAsc, "oldest"),
        "name" => (ResourceOrder::Name, "name"),
        _ => {
            return Err(UiError::bad_request(
                "sort must be activity, oldest or name",
            ));
        }
    };
    let page: i64 = match q.page.as_deref().filter(|p| !p.is_empty()) {
        None => 1,
        Some(p) => p
            .parse()
            .ok()
            .filter(|p| (1..=1_000_000).contains(p))
            .ok_or_else(|| UiError::bad_request("page must be a number from 1"))?,
    };
    let prefix = q.prefix.unwrap_or_default();
    if prefix.len() > 255 {
        return Err(UiError::bad_request(
            "the name prefix is longer than a name",
        ));
    }
    let result = state
        .service
        .list_resources(&ResourceQuery {
            prefix: Some(prefix.clone()).filter(|p| !p.is_empty()),
            held,
            order,
            offset: (page - 1) * PAGE_SIZE,
            limit: PAGE_SIZE,
        })
        .await?;
    let now = result.now;
    let rows: Vec<ResourceRowView> = result
        .rows
        .into_iter()
        .map(|r| {
            let left_ms = r
                .holder
                .as_ref()
                .map_or(0, |h| (h.expires_at - now).num_milliseconds().max(0));
            ResourceRowView {
                href: resource_href(&r.name),
                held: r.holder.is_some(),
                holder: r
                    .holder
                    .as_ref()
                    .map(|h| h.holder.clone())
                    .unwrap_or_default(),
                token: r.holder.as_ref().map(|h| h.token),
                lease_href: r
                    .holder
                    .as_ref()
                    .map(|h| super::format::lease_href(&r.name, h.token)),
                time_left: if r.holder.is_some() {
                    duration_ms(left_ms)
                } else {
                    String::new()
                },
                left_pct: r
                    .holder
                    .as_ref()
                    .map_or(0, |h| (left_ms * 100 / h.ttl_ms.max(1)).clamp(0, 100)),
                last_activity: ago(r.last_activity_at, now),
                last_activity_full: instant(r.last_activity_at),
                last_token: r.last_token,
                accepted_token: r.accepted_token,
                name: r.name,
            }
        })
        .collect();
    let pages = ((result.total + PAGE_SIZE - 1) / PAGE_SIZE).max(1);
    let base_query = format!(
        "prefix={}&state={state_name}&sort={sort_name}",
        enc(&prefix)
    );
    let first_row = if rows.is_empty() {
        0
    } else {
        (page - 1) * PAGE_SIZE + 1
    };
    let page_view = ResourcesPage {
        viewer,
        self_url: format!("/ui/resources?{base_query}&page={page}"),
        last_row: first_row + rows.len() as i64 - i64::from(!rows.is_empty()),
        first_row,
        prefix,
        state: state_name,
        sort: sort_name,
        rows,
        total: result.total,
        page,
        pages,
        base_query,
    };
    Ok(if is_htmx(&headers) {
        render(&page_view.as_table())
    } else {
        render(&page_view)
    })
}
