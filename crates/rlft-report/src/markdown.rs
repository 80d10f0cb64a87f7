//! `report.md`: the card as markdown tables, the dashboard image, and the best and worst
//! rollouts (the HTML page has all the cases).

use std::fmt::Write;

use crate::card::Card;
use crate::cases::CaseGroup;
use crate::html::{clip, reward_chips};
use crate::stats::{fmt_delta, fmt_num};

/// Longest prompt or completion shown, in characters.
const MAX_TEXT: usize = 1200;

/// Text safe in a table cell: no pipes or line breaks.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), fmt_num)
}

/// A code fence longer than any run of backticks in `text`.
fn fence(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    "`".repeat(longest.max(2) + 1)
}

fn code_block(out: &mut String, label: &str, text: &str) {
    let (shown, cut) = clip(text, MAX_TEXT);
    let f = fence(&shown);
    let _ = writeln!(out, "{label}:\n\n{f}text\n{shown}\n{f}");
    if cut > 0 {
        let _ = writeln!(out, "({cut} more characters)");
    }
    out.push('\n');
}

/// The markdown summary.
pub fn render_markdown(card: &Card, cases: &[CaseGroup]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# GRPO run report: {}\n", cell(&card.run_name));
    let _ = writeln!(
        out,
        "Model: `{}`; status: **{}**.\n",
        card.model.as_deref().unwrap_or("unknown").replace('`', "'"),
        card.status.label()
    );
    out.push_str("| | |\n|---|---|\n");
    for t in &card.tiles {
        let detail = if t.detail.is_empty() {
            String::new()
        } else {
            format!(", {}", cell(&t.detail))
        };
        let _ = writeln!(
            out,
            "| {} | **{}**{detail} |",
            cell(&t.label),
            cell(&t.value)
        );
    }
    if !card.config.is_empty() {
        out.push_str("\n## Config\n\n| key | value |\n|---|---|\n");
        for (k, v) in &card.config {
            let _ = writeln!(out, "| {} | {} |", cell(k), cell(v));
        }
    }
    out.push_str("\n## Training metrics\n\n| metric | first | final | mean |\n|---|--:|--:|--:|\n");
    for r in &card.training {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            cell(&r.name),
            opt(r.first),
            opt(r.last),
            opt(r.mean)
        );
    }
    if let Some(e) = &card.eval {
        let _ = writeln!(
            out,
            "\n## Eval\n\n| metric | {} | {} | change |\n|---|--:|--:|--:|",
            cell(&e.before_label),
            cell(&e.after_label)
        );
        for r in &e.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                cell(&r.name),
                opt(r.before),
                opt(r.after),
                r.delta().map_or_else(|| "-".into(), fmt_delta)
            );
        }
    }
    if !card.notes.is_empty() {
        out.push_str("\n## Notes\n\n");
        for n in &card.notes {
            let _ = writeln!(out, "- {}", n.replace('\n', " "));
        }
    }
    out.push_str("\n## Dashboard\n\n![dashboard](dashboard.png)\n");
    let picked = cases
        .iter()
        .filter(|g| g.title == "Best rewards" || g.title == "Worst rewards");
    for g in picked {
        let _ = writeln!(out, "\n## {}\n", g.title);
        if let Some(s) = g.samples.first() {
            let parts: Vec<String> = reward_chips(s)
                .iter()
                .map(|(k, v)| format!("{k} {}", fmt_num(*v)))
                .collect();
            let _ = writeln!(
                out,
                "Step {} ({}), reward **{}**{}.\n",
                s.step,
                s.split,
                fmt_num(s.reward),
                if parts.is_empty() {
                    String::new()
                } else {
                    format!(": {}", parts.join(", "))
                }
            );
            code_block(&mut out, "Prompt", &s.prompt);
            code_block(&mut out, "Completion", &s.completion);
        }
    }
    out.push_str("\nAll cases: `report.html`.\n");
    out
}
