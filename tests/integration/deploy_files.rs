//! The shipped monitoring files agree with what `/metrics` really exposes:
//! the Grafana dashboard parses and uses the data source variable, and the
//! dashboard, the Prometheus rules and docs/metrics.md name only (and, for
//! the docs, every one of) the metrics a running server exposes.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::metrics::Scrape;
use crate::support::{Backend, Harness};

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Metric families of a live server, from its `# TYPE` lines: (name, type).
async fn exposed_families() -> Vec<(String, String)> {
    let h = Harness::start(&Backend::Sqlite).await;
    // The request histogram has series only once a request has finished:
    // the first scrape is that request.
    Scrape::of(&h.server).await;
    let scrape = Scrape::of(&h.server).await;
    h.finish().await;
    scrape
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, kind) = l.split_once(' ').expect("name and type");
            (name.to_owned(), kind.to_owned())
        })
        .collect()
}

/// Every series name a query may use: histogram families add their
/// `_bucket`, `_sum` and `_count` series.
fn series_names(families: &[(String, String)]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (name, kind) in families {
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        } else {
            names.insert(name.clone());
        }
    }
    names
}

/// Identifiers in a PromQL expression (or any text) that name Palisade
/// metrics (`palisade_…`) or recording rules (`level:palisade_…:ops`).
fn palisade_identifiers(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("palisade_") || (t.contains(':') && t.contains("palisade_")))
        .map(|t| t.trim_end_matches(':').to_owned())
        .collect()
}

fn recorded_rules(rules: &str) -> BTreeSet<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record:"))
        .map(|n| n.trim().to_owned())
        .collect()
}

fn check_identifiers(
    what: &str,
    text: &str,
    series: &BTreeSet<String>,
    recorded: &BTreeSet<String>,
) {
    let used = palisade_identifiers(text);
    assert!(!used.is_empty(), "{what} names no Palisade metric");
    for name in used {
        let known = if name.contains(':') {
            recorded.contains(&name)
        } else {
            series.contains(&name)
        };
        assert!(
            known,
            "{what} uses {name}, which is neither exposed nor recorded"
        );
    }
}

fn exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_rules_and_docs_match_the_exposed_metrics() {
    let families = exposed_families().await;
    let series = series_names(&families);
    let rules = read("deploy/prometheus/palisade-rules.yml");
    let recorded = recorded_rules(&rules);
    assert!(!recorded.is_empty());

    // Prose (rule annotations, docs) may also name a histogram's family.
    let mut names = series.clone();
    names.extend(families.iter().map(|(name, _)| name.clone()));

    // Rules.
    check_identifiers("palisade-rules.yml", &rules, &names, &recorded);

    // Dashboard: valid JSON, data source as a variable everywhere.
    let dashboard: Value =
        serde_json::from_str(&read("deploy/grafana/palisade.json")).expect("dashboard is JSON");
    assert_eq!(dashboard["title"], "Palisade");
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    assert!(
        variables.iter().any(|v| v["type"] == "datasource"
            && v["name"] == "datasource"
            && v["query"] == "prometheus"),
        "the data source must be a variable"
    );
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_i64().expect("panel id")),
            "duplicate panel id"
        );
        assert!(
            panel["gridPos"]["w"].as_i64().is_some(),
            "panel without a position"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
        for target in panel["targets"].as_array().expect("targets") {
            assert_eq!(target["datasource"]["uid"], "${datasource}");
        }
    }
    let mut queries = Vec::new();
    exprs(&dashboard, &mut queries);
    for query in &queries {
        check_identifiers("the dashboard", query, &series, &recorded);
    }
    let all_queries = queries.join("\n");
    for wanted in [
        "palisade_acquire_requests_total",
        "palisade_lease_expirations_total",
        "palisade_lease_releases_total",
        "palisade_stale_writes_total",
        "palisade_renewal_margin_seconds_bucket",
        "palisade_stale_write_lateness_seconds_bucket",
        "palisade_http_request_duration_seconds_bucket",
    ] {
        assert!(
            all_queries.contains(wanted),
            "the dashboard has no panel on {wanted}"
        );
    }
    let heatmaps: Vec<_> = panels.iter().filter(|p| p["type"] == "heatmap").collect();
    assert_eq!(heatmaps.len(), 2, "renewal margin and lateness heatmaps");

    // Docs: every exposed family is documented, and nothing else is.
    let docs = read("docs/metrics.md");
    for (name, _) in &families {
        assert!(
            docs.contains(&format!("`{name}`")),
            "docs/metrics.md does not document {name}"
        );
    }
    check_identifiers("docs/metrics.md", &docs, &names, &recorded);
}

/// The configuration reference keeps up with the binary: every `serve`
/// flag (and its environment variable) is in docs/operations.md.
#[test]
fn every_serve_flag_is_documented() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["serve", "--help"])
        .output()
        .expect("run palisade serve --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let docs = read("docs/operations.md");
    let mut missing = Vec::new();
    for word in help.split(|c: char| c.is_whitespace() || c == '[' || c == ']' || c == '=') {
        let is_flag = word.starts_with("--") && word.len() > 2 && word != "--help";
        if (is_flag || word.starts_with("PALISADE_")) && !docs.contains(&format!("`{word}`")) {
            missing.push(word.to_owned());
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "undocumented in docs/operations.md: {missing:?}"
    );
}
