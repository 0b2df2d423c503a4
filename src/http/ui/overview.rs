//! The overview (`/`): what is held now, the last hour in small charts, the
//! most contended resources and the latest stale-write rejections.

use askama::Template;
use axum::Extension;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;

use super::format::{EventRowView, duration_ms, kind_label, resource_href};
use super::{UiError, Viewer, is_htmx, no_change, render};
use crate::domain::EventKind;
use crate::http::AppState;
use crate::store::ui::{EventQuery, OVERVIEW_MINUTES};

pub struct Column {
    pub x: f64,
    pub y: f64,
    pub h: f64,
    pub title: String,
}

pub struct Chart {
    pub kind: &'static str,
    pub label: &'static str,
    pub total: i64,
    pub peak: i64,
    pub columns: Vec<Column>,
}

pub struct ContendedRow {
    pub resource: String,
    pub href: String,
    pub acquisitions: i64,
    pub holders: i64,
    pub expiries: i64,
    pub rejections: i64,
}

#[derive(Template)]
#[template(path = "overview.html", blocks = ["live"])]
pub struct OverviewPage {
    pub viewer: Viewer,
    pub cursor: i64,
    pub active_leases: i64,
    pub resources: i64,
    pub charts: Vec<Chart>,
    pub contended: Vec<ContendedRow>,
    pub rejections: Vec<EventRowView>,
    pub generated_at: String,
}

#[derive(Deserialize)]
pub struct OverviewQuery {
    cursor: Option<i64>,
}

const CHART_W: f64 = 240.0;
const CHART_H: f64 = 44.0;

fn chart(kind: EventKind, per_minute: &[i64]) -> Chart {
    let peak = per_minute.iter().copied().max().unwrap_or(0);
    let step = CHART_W / OVERVIEW_MINUTES as f64;
    let columns = per_minute
        .iter()
        .enumerate()
        .map(|(i, &count)| {
            let h = if peak == 0 {
                0.0
            } else {
                ((count as f64 / peak as f64) * (CHART_H - 2.0)).max(if count > 0 {
                    2.0
                } else {
                    0.0
                })
            };
            let minutes_ago = OVERVIEW_MINUTES - i as i64;
            Column {
                x: (i as f64 * step * 10.0).round() / 10.0,
                y: ((CHART_H - h) * 10.0).round() / 10.0,
                h: (h * 10.0).round() / 10.0,
                title: format!(
                    "{count} {} in the minute ending {} ago",
                    kind_label(kind),
                    duration_ms((minutes_ago - 1) * 60_000)
                ),
            }
        })
        .collect();
    Chart {
        kind: kind.as_str(),
        label: match kind {
            EventKind::Acquired => "Acquisitions",
            EventKind::Expired => "Expiries",
            _ => "Stale writes rejected",
        },
        total: per_minute.iter().sum(),
        peak,
        columns,
    }
}

pub async fn page(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    headers: HeaderMap,
    Query(q): Query<OverviewQuery>,
) -> Result<Response, UiError> {
    let htmx = is_htmx(&headers);
    let latest = state
        .service
        .query_events(&EventQuery {
            limit: 1,
            ..EventQuery::default()
        })
        .await?;
    let cursor = latest.first().map_or(0, |e| e.id);
    if htmx && q.cursor == Some(cursor) {
        return Ok(no_change());
    }
    let overview = state.service.overview(8).await?;
    let now = overview.now;
    let page = OverviewPage {
        viewer,
        cursor,
        active_leases: overview.active_leases,
        resources: overview.resources,
        charts: overview
            .series
            .iter()
            .map(|s| chart(s.kind, &s.per_minute))
            .collect(),
        contended: overview
            .contended
            .into_iter()
            .map(|c| ContendedRow {
                href: resource_href(&c.resource),
                resource: c.resource,
                acquisitions: c.acquisitions,
                holders: c.holders,
                expiries: c.expiries,
                rejections: c.rejections,
            })
            .collect(),
        rejections: overview
            .latest_rejections
            .iter()
            .map(|e| EventRowView::new(e, now))
            .collect(),
        generated_at: super::format::clock(now, now),
    };
    Ok(if htmx {
        render(&page.as_live())
    } else {
        render(&page)
    })
}
