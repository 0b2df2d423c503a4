//! The resource timeline (`/ui/resources/{name}`): a server-drawn SVG
//! swimlane chart of the leases in a time window, one lane per holder,
//! with renewal ticks, accepted writes and stale-write rejections; below it
//! the resource's events, paged. The drawing is bounded: past
//! [`MAX_BARS`] leases the window is drawn as aggregated buckets, and past
//! [`MAX_MARKS`] small marks they are left out with a note.

use std::collections::HashMap;

use askama::Template;
use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use chrono::{DateTime, Duration, NaiveDateTime, TimeZone, Utc};
use serde::Deserialize;

use super::format::{EventRowView, clock, duration_ms, enc, fenced_by, lease_href, summary};
use super::{UiError, Viewer, is_htmx, no_change, render, resource_name};
use crate::domain::{EventKind, LeaseState};
use crate::http::AppState;
use crate::store::Event;
use crate::store::ui::{EventQuery, PublicLease};

/// More leases than this in a window are drawn as aggregated buckets.
pub const MAX_BARS: usize = 400;
/// At most this many renewal ticks and accepted-write dots.
pub const MAX_MARKS: usize = 1500;
/// At most this many rejection markers (each is also listed below).
pub const MAX_REJECTIONS: usize = 300;
const MAX_LANES: usize = 10;
const EVENTS_PER_PAGE: i64 = 50;

const SVG_W: f64 = 1200.0;
const GUTTER: f64 = 170.0;
const PLOT_W: f64 = SVG_W - GUTTER - 16.0;
const AXIS_H: f64 = 26.0;
const LANE_H: f64 = 34.0;
const BAR_H: f64 = 20.0;

fn r1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub struct Lane {
    pub label: String,
    pub y: f64,
    pub text_y: f64,
}

pub struct Tick {
    pub x: f64,
    pub label: String,
}

pub struct Bar {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub class: &'static str,
    pub label: String,
    pub label_x: f64,
    pub title: String,
    pub href: String,
    /// Dashed extension from now to the deadline of an active lease.
    pub deadline: Option<(f64, f64)>,
}

pub struct Mark {
    pub x: f64,
    pub y: f64,
    pub title: String,
    pub href: String,
}

pub struct Rejection {
    pub x: f64,
    pub y: f64,
    pub title: String,
    pub href: String,
    /// The lane of the lease that fenced it out: a line links the two.
    pub link_y: Option<f64>,
}

pub struct Timeline {
    pub height: f64,
    pub plot_x: f64,
    pub plot_right: f64,
    pub axis_y: f64,
    pub lanes: Vec<Lane>,
    pub ticks: Vec<Tick>,
    pub bars: Vec<Bar>,
    pub renewals: Vec<Mark>,
    pub writes: Vec<Mark>,
    pub rejections: Vec<Rejection>,
    pub now_x: Option<f64>,
    pub notes: Vec<String>,
    pub lease_count: usize,
}

/// What the timeline draws from.
pub struct TimelineInput<'a> {
    pub resource: &'a str,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub now: DateTime<Utc>,
    /// Latest first, as the store returns them.
    pub leases: &'a [PublicLease],
    pub leases_truncated: bool,
    /// Renewals, accepted writes and rejections, oldest first.
    pub marks: &'a [Event],
    pub marks_truncated: bool,
}

/// One lane per holder in order of first appearance; holders past
/// [`MAX_LANES`] share an "other holders" lane; aggregated windows have one.
struct Lanes {
    aggregated: bool,
    lease_count: usize,
    index: HashMap<String, usize>,
    lanes: Vec<Lane>,
}

impl Lanes {
    fn new(aggregated: bool, lease_count: usize) -> Self {
        Self {
            aggregated,
            lease_count,
            index: HashMap::new(),
            lanes: Vec::new(),
        }
    }

    fn push(&mut self, label: String) -> usize {
        let y = AXIS_H + 8.0 + self.lanes.len() as f64 * LANE_H;
        self.lanes.push(Lane {
            label,
            y,
            text_y: y + BAR_H / 2.0 + 4.0,
        });
        self.lanes.len() - 1
    }

    /// The y of `holder`'s lane, adding the lane if needed.
    fn lane_for(&mut self, holder: &str) -> f64 {
        if self.aggregated {
            if self.lanes.is_empty() {
                self.push(format!("all holders ({} leases)", self.lease_count));
            }
            return self.lanes[0].y;
        }
        if let Some(&i) = self.index.get(holder) {
            return self.lanes[i].y;
        }
        let i = if self.lanes.len() < MAX_LANES {
            self.push(holder.to_owned())
        } else {
            if self.lanes.len() == MAX_LANES {
                self.push("other holders".to_owned());
            }
            MAX_LANES
        };
        self.index.insert(holder.to_owned(), i);
        self.lanes[i].y
    }

    fn y_of(&self, holder: Option<&str>) -> Option<f64> {
        if self.aggregated {
            return self.lanes.first().map(|l| l.y);
        }
        holder
            .and_then(|h| self.index.get(h))
            .and_then(|&i| self.lanes.get(i))
            .map(|l| l.y)
    }
}

fn state_class(state: LeaseState) -> &'static str {
    match state {
        LeaseState::Active => "s-active",
        LeaseState::Released => "s-released",
        LeaseState::Expired => "s-expired",
        LeaseState::ForceReleased => "s-force_released",
    }
}

fn state_label(state: LeaseState) -> &'static str {
    match state {
        LeaseState::Active => "still active",
        LeaseState::Released => "released",
        LeaseState::Expired => "expired",
        LeaseState::ForceReleased => "force-released",
    }
}

/// A tick step that gives about six to ten ticks over `span_ms`.
fn tick_step_ms(span_ms: i64) -> i64 {
    const STEPS: [i64; 20] = [
        100, 250, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000,
        600_000, 900_000, 1_800_000, 3_600_000, 7_200_000, 10_800_000, 21_600_000, 43_200_000,
    ];
    STEPS
        .into_iter()
        .find(|s| span_ms / s <= 9)
        .unwrap_or(86_400_000)
}

pub fn build(input: &TimelineInput<'_>) -> Timeline {
    let span_ms = (input.to - input.from).num_milliseconds().max(1);
    let x_of = |t: DateTime<Utc>| -> f64 {
        let ms = (t - input.from).num_milliseconds().clamp(0, span_ms);
        r1(GUTTER + PLOT_W * ms as f64 / span_ms as f64)
    };
    let mut notes = Vec::new();
    let aggregated = input.leases.len() > MAX_BARS;

    let mut lanes = Lanes::new(aggregated, input.leases.len());
    let mut bars = Vec::new();
    if aggregated {
        notes.push(format!(
            "{} leases in this window: drawn as buckets. Zoom in to see each lease.",
            input.leases.len()
        ));
        let y = lanes.lane_for("");
        const BUCKETS: usize = 240;
        let mut buckets: Vec<[i64; 4]> = vec![[0; 4]; BUCKETS];
        for lease in input.leases {
            let start = (lease.acquired_at - input.from)
                .num_milliseconds()
                .clamp(0, span_ms - 1);
            let i = (start as usize * BUCKETS) / span_ms as usize;
            let slot = match lease.state_at(input.now) {
                LeaseState::Active => 0,
                LeaseState::Released => 1,
                LeaseState::Expired => 2,
                LeaseState::ForceReleased => 3,
            };
            if let Some(b) = buckets.get_mut(i) {
                b[slot] += 1;
            }
        }
        let width = PLOT_W / BUCKETS as f64;
        for (i, counts) in buckets.iter().enumerate() {
            let total: i64 = counts.iter().sum();
            if total == 0 {
                continue;
            }
            let states = [
                LeaseState::Active,
                LeaseState::Released,
                LeaseState::Expired,
                LeaseState::ForceReleased,
            ];
            // The bucket takes the colour of its worst ending.
            let worst = [3usize, 2, 0, 1]
                .into_iter()
                .find(|&s| counts[s] > 0)
                .unwrap_or(1);
            let start = input.from + Duration::milliseconds(span_ms * i as i64 / BUCKETS as i64);
            bars.push(Bar {
                x: r1(GUTTER + width * i as f64),
                y,
                w: r1(width.max(1.0)),
                class: state_class(states[worst]),
                label: String::new(),
                label_x: 0.0,
                title: format!(
                    "{total} leases from {}: {} released, {} expired, {} force-released, {} active",
                    clock(start, input.now),
                    counts[1],
                    counts[2],
                    counts[3],
                    counts[0]
                ),
                href: String::new(),
                deadline: None,
            });
        }
    } else {
        for lease in input.leases.iter().rev() {
            let lane_y = lanes.lane_for(&lease.holder);
            let state = lease.state_at(input.now);
            let end = lease.ended_at_as_of(input.now).unwrap_or(input.now);
            let x = x_of(lease.acquired_at);
            let x_end = x_of(end);
            let w = r1((x_end - x).max(2.0));
            let label = if w > 110.0 {
                format!("#{} {}", lease.token, lease.holder)
            } else if w > 30.0 {
                format!("#{}", lease.token)
            } else {
                String::new()
            };
            let ended = match lease.ended_at_as_of(input.now) {
                Some(t) => format!(
                    "{} at {} after {}",
                    state_label(state),
                    clock(t, input.now),
                    duration_ms((t - lease.acquired_at).num_milliseconds())
                ),
                None => format!(
                    "still active, {} left",
                    duration_ms((lease.expires_at - input.now).num_milliseconds())
                ),
            };
            bars.push(Bar {
                x,
                y: lane_y,
                w,
                class: state_class(state),
                label_x: r1(x + 6.0),
                label,
                title: format!(
                    "Lease #{} held by {}\nacquired {}\n{}\nttl {}",
                    lease.token,
                    lease.holder,
                    clock(lease.acquired_at, input.now),
                    ended,
                    duration_ms(lease.ttl_ms)
                ),
                href: lease_href(input.resource, lease.token),
                deadline: (state == LeaseState::Active)
                    .then(|| (x_end, x_of(lease.expires_at)))
                    .filter(|(a, b)| b > a),
            });
        }
    }
    if input.leases_truncated {
        notes.push(format!(
            "Only the latest {} leases of this window are drawn.",
            input.leases.len()
        ));
    }

    let mut renewals = Vec::new();
    let mut writes = Vec::new();
    let mut rejections = Vec::new();
    let small_marks = input
        .marks
        .iter()
        .filter(|e| e.kind != EventKind::WriteRejected)
        .count();
    let draw_small = small_marks <= MAX_MARKS && !aggregated;
    if !draw_small && small_marks > 0 {
        notes.push(format!(
            "{small_marks} renewals and accepted writes in this window are not drawn; zoom in to see them."
        ));
    }
    for event in input.marks {
        let x = x_of(event.at);
        let title = format!(
            "{} at {}{}{}",
            super::format::kind_label(event.kind),
            clock(event.at, input.now),
            event
                .token
                .map(|t| format!(" · token {t}"))
                .unwrap_or_default(),
            {
                let s = summary(event);
                if s.is_empty() { s } else { format!("\n{s}") }
            }
        );
        let href = event
            .token
            .map(|t| lease_href(input.resource, t))
            .unwrap_or_default();
        match event.kind {
            EventKind::Renewed | EventKind::WriteAccepted if draw_small => {
                let Some(y) = lanes.y_of(event.holder.as_deref()) else {
                    continue;
                };
                let mark = Mark { x, y, title, href };
                if event.kind == EventKind::Renewed {
                    renewals.push(mark);
                } else {
                    writes.push(mark);
                }
            }
            EventKind::WriteRejected if rejections.len() < MAX_REJECTIONS => {
                // A zombie's lane may hold no bar in this window (its lease
                // ended before): it still gets a lane of its own.
                let y = match lanes.y_of(event.holder.as_deref()) {
                    Some(y) => y,
                    None => lanes.lane_for(event.holder.as_deref().unwrap_or("unknown holder")),
                };
                let link_y = fenced_by(&event.detail)
                    .and_then(|(_, holder)| lanes.y_of(Some(&holder)))
                    .filter(|ly| (*ly - y).abs() > 1.0);
                rejections.push(Rejection {
                    x,
                    y,
                    title,
                    href,
                    link_y,
                });
            }
            _ => {}
        }
    }
    if input.marks_truncated {
        notes.push("This window has more events than the timeline draws; zoom in.".to_owned());
    }

    // Ticks.
    let step = tick_step_ms(span_ms);
    let first = (input.from.timestamp_millis() / step + 1) * step;
    let mut ticks = Vec::new();
    let mut t = first;
    while t < input.to.timestamp_millis() && ticks.len() < 24 {
        if let Some(at) = Utc.timestamp_millis_opt(t).single() {
            let label = if step < 1_000 {
                at.format("%H:%M:%S%.3f").to_string()
            } else if step < 60_000 {
                at.format("%H:%M:%S").to_string()
            } else if step < 86_400_000 {
                at.format("%H:%M").to_string()
            } else {
                at.format("%b %d").to_string()
            };
            ticks.push(Tick { x: x_of(at), label });
        }
        t += step;
    }
    let now_x = (input.now > input.from && input.now < input.to).then(|| x_of(input.now));
    // The "now" label wins over a tick label it would overlap.
    if let Some(nx) = now_x {
        for tick in &mut ticks {
            if (tick.x - nx).abs() < 36.0 {
                tick.label.clear();
            }
        }
    }
    let lanes = lanes.lanes;
    let lanes_shown = lanes.len().max(1);
    let height = AXIS_H + 8.0 + lanes_shown as f64 * LANE_H + 6.0;
    Timeline {
        height,
        plot_x: GUTTER,
        plot_right: GUTTER + PLOT_W,
        axis_y: AXIS_H,
        now_x,
        lease_count: input.leases.len(),
        lanes,
        ticks,
        bars,
        renewals,
        writes,
        rejections,
        notes,
    }
}

/// The window a timeline shows.
pub struct Window {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// "5m", "1h", "24h" or "custom".
    pub name: &'static str,
    /// Follows the present (no fixed end): redrawn on every poll.
    pub follows_now: bool,
}

#[derive(Deserialize, Default)]
pub struct TimelineQuery {
    window: Option<String>,
    /// End of a relative window, Unix milliseconds (paging back in time).
    end: Option<String>,
    from: Option<String>,
    to: Option<String>,
    before: Option<String>,
    cursor: Option<i64>,
    notice: Option<String>,
}

/// `2026-12-02T10:40`, `2026-12-02T10:40:05` (UTC, as a datetime-local
/// input sends it) or RFC 3339.
fn parse_instant(text: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
        .map(|n| n.and_utc())
}

fn parse_window(q: &TimelineQuery, now: DateTime<Utc>) -> Result<Window, UiError> {
    let name = q.window.as_deref().unwrap_or("5m");
    let span = match name {
        "5m" => Some(("5m", Duration::minutes(5))),
        "1h" => Some(("1h", Duration::hours(1))),
        "24h" => Some(("24h", Duration::hours(24))),
        "custom" => None,
        _ => return Err(UiError::bad_request("window must be 5m, 1h, 24h or custom")),
    };
    match span {
        Some((name, span)) => {
            let end = match q.end.as_deref().filter(|e| !e.is_empty()) {
                None => None,
                Some(e) => Some(
                    e.parse::<i64>()
                        .ok()
                        .and_then(|ms| Utc.timestamp_millis_opt(ms).single())
                        .ok_or_else(|| UiError::bad_request("end must be Unix milliseconds"))?,
                ),
            };
            let to = end.unwrap_or(now + span / 20);
            Ok(Window {
                from: to - span,
                to,
                name,
                follows_now: end.is_none(),
            })
        }
        None => {
            let from = q
                .from
                .as_deref()
                .and_then(parse_instant)
                .ok_or_else(|| UiError::bad_request("from must be a date and time (UTC)"))?;
            let to =
                q.to.as_deref()
                    .and_then(parse_instant)
                    .ok_or_else(|| UiError::bad_request("to must be a date and time (UTC)"))?;
            if to <= from {
                return Err(UiError::bad_request("to must be after from"));
            }
            if to - from > Duration::days(366) {
                return Err(UiError::bad_request("a window spans at most a year"));
            }
            Ok(Window {
                from,
                to,
                name: "custom",
                follows_now: false,
            })
        }
    }
}

pub struct HolderView {
    pub holder: String,
    pub token: i64,
    pub lease_href: String,
    pub acquired: String,
    pub time_left: String,
}

#[derive(Template)]
#[template(path = "resource.html", blocks = ["live"])]
pub struct ResourcePage {
    pub viewer: Viewer,
    pub name: String,
    pub href: String,
    pub last_token: i64,
    pub accepted_token: i64,
    pub holder: Option<HolderView>,
    pub window: &'static str,
    pub from_input: String,
    pub to_input: String,
    pub range_label: String,
    pub earlier_href: String,
    pub later_href: Option<String>,
    pub live_href: String,
    pub follows_now: bool,
    pub timeline: Timeline,
    pub events: Vec<EventRowView>,
    pub older_href: Option<String>,
    pub paging_events: bool,
    pub notice: Option<&'static str>,
}

fn input_value(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S").to_string()
}

pub async fn page(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    headers: HeaderMap,
    Path(raw_name): Path<String>,
    Query(q): Query<TimelineQuery>,
) -> Result<Response, UiError> {
    let name = resource_name(raw_name)?;
    let htmx = is_htmx(&headers);
    let before = match q.before.as_deref().filter(|b| !b.is_empty()) {
        None => None,
        Some(b) => Some(
            b.parse::<i64>()
                .map_err(|_| UiError::bad_request("before must be an event id"))?,
        ),
    };
    let view = state
        .service
        .resource(&name)
        .await?
        .ok_or_else(|| UiError::not_found("no resource by that name has ever been used"))?;
    let now = view.now;
    let window = parse_window(&q, now)?;
    let latest = state
        .service
        .query_events(&EventQuery {
            resource: Some(name.as_str().to_owned()),
            limit: 1,
            ..EventQuery::default()
        })
        .await?;
    let cursor = latest.first().map_or(0, |e| e.id);
    // A fixed window with nothing new needs no redraw.
    if htmx && !window.follows_now && q.cursor == Some(cursor) {
        return Ok(no_change());
    }
    let leases = state
        .service
        .leases_in_window(&name, window.from, window.to, 2_000)
        .await?;
    let marks_limit = (MAX_MARKS + MAX_REJECTIONS + 1) as i64;
    let marks = state
        .service
        .events_in_window(
            &name,
            &[
                EventKind::Renewed,
                EventKind::WriteAccepted,
                EventKind::WriteRejected,
            ],
            window.from,
            window.to,
            marks_limit,
        )
        .await?;
    let timeline = build(&TimelineInput {
        resource: name.as_str(),
        from: window.from,
        to: window.to,
        now,
        leases_truncated: leases.len() >= 2_000,
        leases: &leases,
        marks_truncated: marks.len() as i64 >= marks_limit,
        marks: &marks,
    });
    let events = state
        .service
        .query_events(&EventQuery {
            resource: Some(name.as_str().to_owned()),
            before,
            limit: EVENTS_PER_PAGE,
            ..EventQuery::default()
        })
        .await?;
    let href = super::format::resource_href(name.as_str());
    let span = window.to - window.from;
    let window_query = |end: DateTime<Utc>| -> String {
        if window.name == "custom" {
            format!(
                "{href}?window=custom&from={}&to={}",
                enc(&input_value(end - span)),
                enc(&input_value(end))
            )
        } else {
            format!(
                "{href}?window={}&end={}",
                window.name,
                end.timestamp_millis()
            )
        }
    };
    let later_end = window.to + span;
    let page = ResourcePage {
        viewer,
        name: name.as_str().to_owned(),
        last_token: view.row.last_token,
        accepted_token: view.row.accepted_token,
        holder: view.holder.as_ref().map(|l| HolderView {
            holder: l.holder.as_str().to_owned(),
            token: l.token.get(),
            lease_href: lease_href(name.as_str(), l.token.get()),
            acquired: clock(l.acquired_at, now),
            time_left: duration_ms((l.expires_at - now).num_milliseconds().max(0)),
        }),
        window: window.name,
        from_input: input_value(window.from),
        to_input: input_value(window.to),
        range_label: format!(
            "{} – {} UTC",
            clock(window.from, now),
            clock(window.to, now)
        ),
        earlier_href: window_query(window.from),
        later_href: (!window.follows_now).then(|| {
            if later_end >= now && window.name != "custom" {
                format!("{href}?window={}", window.name)
            } else {
                window_query(later_end)
            }
        }),
        live_href: format!(
            "{href}?window={}{}&cursor={cursor}",
            window.name,
            if window.name == "custom" {
                format!(
                    "&from={}&to={}",
                    enc(&input_value(window.from)),
                    enc(&input_value(window.to))
                )
            } else {
                window
                    .follows_now
                    .then(String::new)
                    .unwrap_or_else(|| format!("&end={}", window.to.timestamp_millis()))
            }
        ),
        follows_now: window.follows_now,
        timeline,
        older_href: (events.len() as i64 == EVENTS_PER_PAGE)
            .then(|| {
                events
                    .last()
                    .map(|e| format!("{href}?window={}&before={}", window.name, e.id))
            })
            .flatten(),
        paging_events: before.is_some(),
        events: events.iter().map(|e| EventRowView::new(e, now)).collect(),
        notice: match q.notice.as_deref() {
            Some("force_released") => Some(
                "The lease was force-released. Its holder's renewals now get 410 and its writes are rejected as stale.",
            ),
            Some("not_held") => Some("Nothing to release: the resource was not held any more."),
            _ => None,
        },
        href,
    };
    Ok(if htmx {
        render(&page.as_live())
    } else {
        render(&page)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms)
            .single()
            .unwrap()
    }

    fn lease(
        token: i64,
        holder: &str,
        from: i64,
        to: Option<i64>,
        state: LeaseState,
    ) -> PublicLease {
        PublicLease {
            resource: "r".into(),
            token,
            holder: holder.into(),
            state,
            ttl_ms: 5_000,
            acquired_at: at(from),
            expires_at: at(to.unwrap_or(from + 5_000)),
            ended_at: to.map(at),
        }
    }

    #[test]
    fn bars_are_laned_by_holder_and_coloured_by_ending() {
        let leases = vec![
            lease(3, "alice", 20_000, None, LeaseState::Active),
            lease(2, "bob", 10_000, Some(15_000), LeaseState::Expired),
            lease(1, "alice", 0, Some(5_000), LeaseState::Released),
        ];
        let t = build(&TimelineInput {
            resource: "r",
            from: at(0),
            to: at(60_000),
            now: at(22_000),
            leases: &leases,
            leases_truncated: false,
            marks: &[],
            marks_truncated: false,
        });
        assert_eq!(t.lanes.len(), 2);
        assert_eq!(t.lanes[0].label, "alice");
        assert_eq!(t.bars.len(), 3);
        assert_eq!(t.bars[0].class, "s-released");
        assert_eq!(t.bars[1].class, "s-expired");
        assert_eq!(t.bars[2].class, "s-active");
        assert_eq!(t.bars[0].y, t.bars[2].y);
        assert!(t.bars[2].deadline.is_some());
        assert!(t.now_x.is_some());
        assert!(t.notes.is_empty());
    }

    #[test]
    fn many_leases_are_aggregated_into_a_bounded_number_of_bars() {
        let leases: Vec<_> = (0..5_000)
            .map(|i| {
                lease(
                    i + 1,
                    &format!("w{i}"),
                    i * 10,
                    Some(i * 10 + 5),
                    LeaseState::Released,
                )
            })
            .collect();
        let t = build(&TimelineInput {
            resource: "r",
            from: at(0),
            to: at(50_000),
            now: at(60_000),
            leases: &leases,
            leases_truncated: false,
            marks: &[],
            marks_truncated: false,
        });
        assert_eq!(t.lanes.len(), 1);
        assert!(t.bars.len() <= 240, "{}", t.bars.len());
        assert!(!t.notes.is_empty());
    }

    #[test]
    fn tick_steps_are_round() {
        assert_eq!(tick_step_ms(300_000), 60_000);
        assert_eq!(tick_step_ms(3_600_000), 600_000);
        assert_eq!(tick_step_ms(86_400_000), 10_800_000);
    }
}
