//! The labels of a ServiceEntry and of its endpoints: those Kubernetes would reject dropped, those
//! over `--max-labels` cut, one warning each; registry and source names mapped to label values.

use super::naming::{check_label_key, check_label_value, map_dns_label};
use super::WarningKind;
use crate::model::{LabelSet, Labels};

/// Endpoint label sets already checked in one service, with what checking them found.
///
/// Endpoints of a service share a few label sets, so each distinct set is validated once rather
/// than once per endpoint; a valid set (the usual case) is kept as is, shared, not copied. At most
/// [`CheckedLabels::MAX`] sets are remembered, so a service whose endpoints all carry different
/// labels costs no more than checking each.
pub(super) struct CheckedLabels {
    /// `--max-labels`.
    max_labels: usize,
    /// `--endpoint-source-labels`: added to every set (they win over a registry's own).
    source: Option<[(String, String); 2]>,
    seen: Vec<Checked>,
}

struct Checked {
    given: LabelSet,
    clean: LabelSet,
    /// What was dropped, one message each (without the field).
    problems: Vec<(WarningKind, String)>,
}

impl CheckedLabels {
    const MAX: usize = 16;

    pub(super) fn new(max_labels: usize, source: Option<[(String, String); 2]>) -> Self {
        Self {
            max_labels,
            source,
            seen: Vec::new(),
        }
    }

    /// `labels` without the ones Kubernetes would reject and those over `--max-labels`, one
    /// warning each.
    pub(super) fn clean(
        &mut self,
        labels: LabelSet,
        field: impl Fn() -> String,
        warnings: &mut Vec<(WarningKind, String)>,
    ) -> LabelSet {
        let max = self.max_labels;
        let source = self.source.as_ref();
        let checked = match self.seen.iter().position(|c| c.given.ptr_eq(&labels)) {
            Some(i) => &self.seen[i],
            None if self.seen.len() < Self::MAX => {
                self.seen.push(Checked::of(labels, max, source));
                &self.seen[self.seen.len() - 1]
            }
            None => &Checked::of(labels, max, source),
        };
        for (kind, e) in &checked.problems {
            warnings.push((*kind, format!("{}: {e}", field())));
        }
        checked.clean.clone()
    }
}

impl Checked {
    fn of(given: LabelSet, max_labels: usize, source: Option<&[(String, String); 2]>) -> Self {
        let check = |k: &str, v: &str| check_label_key(k).and_then(|()| check_label_value(k, v));
        let mut problems: Vec<(WarningKind, String)> = given
            .iter()
            .filter_map(|(k, v)| check(k, v).err())
            .map(|e| (WarningKind::Label, format!("{e}; label dropped")))
            .collect();
        let valid = given.len() - problems.len();
        let clean = if problems.is_empty() && valid <= max_labels {
            given.clone()
        } else {
            let kept: Vec<(&str, &str)> =
                given.iter().filter(|(k, v)| check(k, v).is_ok()).collect();
            if valid > max_labels {
                let dropped: Vec<&str> = kept[max_labels..].iter().map(|(k, _)| *k).collect();
                problems.push((
                    WarningKind::LabelLimit,
                    over_limit(valid, max_labels, &dropped),
                ));
            }
            kept.into_iter().take(max_labels).collect()
        };
        // The source's labels are the adapter's own, valid by construction, and not counted
        // against --max-labels (which bounds what a registry's free-form metadata brings).
        let clean = match source {
            None => clean,
            Some(extra) => {
                let mut all = clean.to_labels();
                all.extend(extra.iter().cloned());
                LabelSet::from(all)
            }
        };
        Self {
            given,
            clean,
            problems,
        }
    }
}

/// Drops labels Kubernetes would reject, and those over `max` (the first `max` by key stay),
/// one warning each.
pub(super) fn clean_labels(
    mut labels: Labels,
    max: usize,
    field: impl Fn() -> String,
    warnings: &mut Vec<(WarningKind, String)>,
) -> Labels {
    labels.retain(
        |k, v| match check_label_key(k).and_then(|()| check_label_value(k, v)) {
            Ok(()) => true,
            Err(e) => {
                warnings.push((
                    WarningKind::Label,
                    format!("{}: {e}; label dropped", field()),
                ));
                false
            }
        },
    );
    if labels.len() > max {
        let valid = labels.len();
        let over: Vec<String> = labels.keys().skip(max).cloned().collect();
        for k in &over {
            labels.remove(k);
        }
        let dropped: Vec<&str> = over.iter().map(String::as_str).collect();
        warnings.push((
            WarningKind::LabelLimit,
            format!("{}: {}", field(), over_limit(valid, max, &dropped)),
        ));
    }
    labels
}

/// Names shown of the labels a limit dropped; the rest are counted.
const DROPPED_SHOWN: usize = 5;

/// The warning for `valid` labels cut to `max`: which stayed and which went.
fn over_limit(valid: usize, max: usize, dropped: &[&str]) -> String {
    let mut names = dropped
        .iter()
        .take(DROPPED_SHOWN)
        .map(|k| format!("{k:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    if dropped.len() > DROPPED_SHOWN {
        names.push_str(&format!(" and {} more", dropped.len() - DROPPED_SHOWN));
    }
    format!(
        "{valid} labels, more than --max-labels {max}; kept the first {max} by key, dropped {}: {names}",
        dropped.len()
    )
}

/// Source and registry names become label values; map them rather than fail.
pub fn label_safe(s: &str) -> String {
    let l = map_dns_label(s);
    if l.is_empty() {
        "unknown".into()
    } else {
        l
    }
}
