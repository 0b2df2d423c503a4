//! Which resources a client API key may touch: a set of resource-name
//! prefixes. Matching is a plain byte prefix of the name, so a prefix that
//! should stop at a separator must include it (`reports/`, not `reports`).

use super::names::ResourceName;

/// A resource-name prefix: at most 255 bytes, no control characters. The
/// empty prefix covers every resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePrefix(String);

impl ResourcePrefix {
    pub fn parse(value: impl Into<String>) -> Result<Self, String> {
        let value = value.into();
        if value.len() > ResourceName::MAX_BYTES {
            return Err(format!(
                "a prefix must be at most {} bytes (got {})",
                ResourceName::MAX_BYTES,
                value.len()
            ));
        }
        if let Some(c) = value.chars().find(|c| c.is_control()) {
            return Err(format!(
                "a prefix must not contain control characters (found U+{:04X})",
                u32::from(c)
            ));
        }
        Ok(Self(value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn covers(&self, resource: &ResourceName) -> bool {
        resource.as_str().starts_with(&self.0)
    }

    pub fn covers_everything(&self) -> bool {
        self.0.is_empty()
    }
}

/// The resources one key may act on: any name that starts with one of its
/// prefixes. Never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope(Vec<ResourcePrefix>);

impl Scope {
    pub fn new(prefixes: Vec<ResourcePrefix>) -> Result<Self, String> {
        if prefixes.is_empty() {
            return Err("a key needs at least one prefix (\"\" covers every resource)".into());
        }
        Ok(Self(prefixes))
    }

    pub fn covers(&self, resource: &ResourceName) -> bool {
        self.0.iter().any(|p| p.covers(resource))
    }

    /// True when some prefix is empty: the key may act on any resource,
    /// including listing the whole event log.
    pub fn covers_everything(&self) -> bool {
        self.0.iter().any(ResourcePrefix::covers_everything)
    }

    pub fn prefixes(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(ResourcePrefix::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ResourceName {
        ResourceName::parse(s).unwrap()
    }

    fn scope(prefixes: &[&str]) -> Scope {
        Scope::new(
            prefixes
                .iter()
                .map(|p| ResourcePrefix::parse(*p).unwrap())
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn a_prefix_matches_bytes_from_the_start() {
        let reports = scope(&["reports/"]);
        assert!(reports.covers(&name("reports/daily")));
        assert!(reports.covers(&name("reports/")));
        assert!(
            !reports.covers(&name("reports")),
            "the separator is part of the prefix"
        );
        assert!(!reports.covers(&name("reports-evil/x")));
        assert!(!reports.covers(&name("Reports/daily")), "case-sensitive");
        assert!(
            !reports.covers(&name("x/reports/daily")),
            "only at the start"
        );
        assert!(!reports.covers_everything());
    }

    #[test]
    fn without_a_separator_a_prefix_also_covers_longer_names() {
        // Documented pitfall: "reports" covers "reports-evil" too.
        assert!(scope(&["reports"]).covers(&name("reports-evil")));
    }

    #[test]
    fn any_of_several_prefixes_and_the_empty_prefix() {
        let two = scope(&["a/", "b/"]);
        assert!(two.covers(&name("a/1")) && two.covers(&name("b/2")));
        assert!(!two.covers(&name("c/3")));
        let all = scope(&["team/", ""]);
        assert!(all.covers(&name("anything")));
        assert!(all.covers_everything());
        assert_eq!(all.prefixes().collect::<Vec<_>>(), ["team/", ""]);
    }

    #[test]
    fn multibyte_names_match_by_bytes() {
        let s = scope(&["équipe/"]);
        assert!(s.covers(&name("équipe/lot")));
        assert!(!s.covers(&name("equipe/lot")));
    }

    #[test]
    fn invalid_prefixes_and_empty_scopes_are_refused() {
        assert!(ResourcePrefix::parse("a\nb").is_err());
        assert!(ResourcePrefix::parse("x".repeat(256)).is_err());
        assert!(ResourcePrefix::parse("x".repeat(255)).is_ok());
        assert!(Scope::new(Vec::new()).is_err());
    }
}
