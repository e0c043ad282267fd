//! How the checks are shown: a table for people, with each distinct
//! finding once below it, or the summary `-o json|yaml` prints.

use serde::Serialize;

use super::judge::Check;

#[derive(Serialize)]
pub(super) struct Summary<'a> {
    pub(super) passed: bool,
    pub(super) checks: &'a [Check],
}

pub(super) fn table(checks: &[Check]) -> String {
    let mut table = comfy_table::Table::new();
    table
        .load_style(comfy_table::presets::UTF8_BORDERS_ONLY)
        .set_header(["FROM", "TO", "ADDRESS", "RESULT"]);
    for c in checks {
        let to = format!("{} ({} {})", c.to, c.kind, c.name);
        let result = if c.passed {
            format!(
                "ok, {:.2} ms, seen from {}",
                c.rtt_ms.unwrap_or_default(),
                c.seen_from.as_deref().unwrap_or("?")
            )
        } else {
            format!("FAILED: {}", c.error.as_deref().unwrap_or("no answer"))
        };
        table.add_row([c.from.as_str(), to.as_str(), c.address.as_str(), &result]);
    }
    let mut text = table.to_string();
    // Where each failure lies, once per distinct finding.
    let mut told = Vec::new();
    for c in checks.iter().filter(|c| !c.passed) {
        if let Some(hint) = c.hint.as_ref().filter(|h| !told.contains(h)) {
            text.push_str(&format!("\n{} to {}'s {}: {hint}", c.from, c.to, c.kind));
            told.push(hint);
        }
    }
    text
}
