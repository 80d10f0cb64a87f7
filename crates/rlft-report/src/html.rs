//! `report.html`: one self-contained page (inline CSS, the dashboard SVG inlined, no scripts,
//! no external assets) with the card, the dashboard and the rollout cases.

use std::fmt::Write;

use crate::card::{Card, Tone};
use crate::cases::CaseGroup;
use crate::run::{RunStatus, Sample};
use crate::stats::{fmt_delta, fmt_num};

/// Longest prompt or completion shown in full, in characters.
const MAX_TEXT: usize = 4000;

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` cut to `max` characters, with how much was left out.
pub(crate) fn clip(s: &str, max: usize) -> (String, usize) {
    match s.char_indices().nth(max) {
        Some((i, _)) => (s[..i].to_owned(), s[i..].chars().count()),
        None => (s.to_owned(), 0),
    }
}

const CSS: &str = r#"
:root{--ink:#111827;--muted:#6b7280;--line:#e5e7eb;--bg:#f4f6f9;--card:#fff;--good:#15803d;--bad:#b91c1c}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
main{max-width:1280px;margin:0 auto;padding:28px 24px 48px}
h1{font-size:26px;margin:0 0 4px}
h2{font-size:19px;margin:34px 0 12px}
h3{font-size:16px;margin:22px 0 4px}
.sub{color:var(--muted);margin:0 0 18px}
.badge{display:inline-block;padding:2px 10px;border-radius:999px;font-size:13px;font-weight:600;vertical-align:middle;margin-left:8px}
.finished{background:#dcfce7;color:#166534}.interrupted{background:#fef3c7;color:#92400e}.progress{background:#dbeafe;color:#1e40af}.other{background:#e5e7eb;color:#374151}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(190px,1fr));gap:12px}
.tile,.panel,.case{background:var(--card);border:1px solid var(--line);border-radius:10px}
.tile{padding:12px 16px}
.tile .l{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.tile .v{font-size:28px;font-weight:650;font-variant-numeric:tabular-nums}
.tile .d{font-size:13px;color:var(--muted)}
.good{color:var(--good)!important}.bad{color:var(--bad)!important}
.cols{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:16px;margin-top:16px;align-items:start}
.panel{padding:12px 16px;overflow-x:auto}
.stack{display:flex;flex-direction:column;gap:16px}
td.k{color:var(--muted);font:13px ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;white-space:nowrap}
.panel h2{margin:0 0 8px;font-size:16px}
table{border-collapse:collapse;width:100%;font-size:14px}
th,td{padding:5px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{color:var(--muted);font-weight:600;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:last-child td{border-bottom:none}
.notes{background:#fffbeb;border:1px solid #fde68a;border-radius:10px;padding:8px 16px 8px 32px;margin-top:16px;font-size:14px}
figure{margin:0;background:var(--card);border:1px solid var(--line);border-radius:10px;padding:8px}
figure svg{display:block;width:100%;height:auto}
figcaption{color:var(--muted);font-size:13px;padding:4px 8px}
.about{color:var(--muted);margin:0 0 8px;font-size:14px}
.cases{display:grid;grid-template-columns:repeat(auto-fit,minmax(380px,1fr));gap:12px}
.case{padding:10px 14px}
.meta{font-size:13px;color:var(--muted);display:flex;flex-wrap:wrap;gap:6px 10px;align-items:center}
.r{font-weight:700;color:var(--ink);font-size:15px}
.chip{background:#f3f4f6;border-radius:6px;padding:0 7px;font-variant-numeric:tabular-nums}
.lbl{font-size:11px;text-transform:uppercase;letter-spacing:.05em;color:var(--muted);margin-top:8px}
pre{margin:2px 0 0;padding:8px 10px;border-radius:6px;white-space:pre-wrap;word-break:break-word;font:13px/1.45 ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;max-height:18em;overflow:auto}
pre.p{background:#f3f4f6;color:#374151}
pre.c{background:#eef6ff;color:#0f172a}
footer{color:var(--muted);font-size:12px;margin-top:36px}
"#;

fn tone_class(t: Tone) -> &'static str {
    match t {
        Tone::Good => " good",
        Tone::Bad => " bad",
        Tone::Neutral => "",
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), fmt_num)
}

fn card_html(out: &mut String, card: &Card) {
    let (class, label) = match &card.status {
        RunStatus::Finished => ("finished", "finished"),
        RunStatus::Interrupted => ("interrupted", "interrupted"),
        RunStatus::InProgress => ("progress", "in progress"),
        RunStatus::Other(s) => ("other", s.as_str()),
    };
    let _ = write!(
        out,
        "<h1>{}<span class=\"badge {class}\">{}</span></h1>\n<p class=\"sub\">{} &middot; GRPO run report</p>\n",
        escape(&card.run_name),
        escape(label),
        escape(card.model.as_deref().unwrap_or("model unknown")),
    );
    out.push_str("<section class=\"tiles\">\n");
    for t in &card.tiles {
        let _ = writeln!(
            out,
            "<div class=\"tile\"><div class=\"l\">{}</div><div class=\"v\">{}</div><div class=\"d{}\">{}</div></div>",
            escape(&t.label),
            escape(&t.value),
            tone_class(t.tone),
            escape(&t.detail)
        );
    }
    out.push_str("</section>\n<section class=\"cols\">\n<div class=\"stack\">\n");
    if let Some(e) = &card.eval {
        out.push_str("<div class=\"panel\"><h2>Eval</h2><table>\n");
        let _ = writeln!(
            out,
            "<tr><th>metric</th><th class=\"n\">{}</th><th class=\"n\">{}</th><th class=\"n\">change</th></tr>",
            escape(&e.before_label),
            escape(&e.after_label)
        );
        for r in &e.rows {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n{}\">{}</td></tr>",
                escape(&r.name),
                opt(r.before),
                opt(r.after),
                tone_class(r.tone()),
                r.delta().map_or_else(|| "-".into(), fmt_delta)
            );
        }
        out.push_str("</table></div>\n");
    }
    if !card.config.is_empty() {
        out.push_str("<div class=\"panel\"><h2>Config</h2><table>\n");
        for (k, v) in &card.config {
            let _ = writeln!(
                out,
                "<tr><td class=\"k\">{}</td><td>{}</td></tr>",
                escape(k),
                escape(v)
            );
        }
        out.push_str("</table></div>\n");
    }
    out.push_str("</div>\n<div class=\"panel\"><h2>Training metrics</h2><table>\n");
    out.push_str("<tr><th>metric</th><th class=\"n\">first</th><th class=\"n\">final</th><th class=\"n\">mean</th></tr>\n");
    for r in &card.training {
        let _ = writeln!(
            out,
            "<tr><td title=\"{}\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            escape(&r.key),
            escape(&r.name),
            opt(r.first),
            opt(r.last),
            opt(r.mean)
        );
    }
    out.push_str("</table></div>\n");
    out.push_str("</section>\n");
    if !card.notes.is_empty() {
        out.push_str("<ul class=\"notes\">\n");
        for n in &card.notes {
            let _ = writeln!(out, "<li>{}</li>", escape(n));
        }
        out.push_str("</ul>\n");
    }
}

fn text_block(out: &mut String, class: &str, label: &str, text: &str) {
    let (shown, cut) = clip(text, MAX_TEXT);
    let more = if cut > 0 {
        format!("\n[... {cut} more characters]")
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "<div class=\"lbl\">{label}</div><pre class=\"{class}\">{}{}</pre>",
        escape(&shown),
        escape(&more)
    );
}

/// A sample's reward parts with short names: a lone function's total is left out when it is
/// the reward itself, and parts go by their own name unless two functions share it.
pub(crate) fn reward_chips(s: &Sample) -> Vec<(String, f64)> {
    let functions = s.rewards.iter().filter(|(k, _)| !k.contains('/')).count();
    let part = |k: &str| k.split_once('/').map(|p| p.1.to_owned());
    s.rewards
        .iter()
        .filter(|(k, v)| !(functions == 1 && !k.contains('/') && (*v - s.reward).abs() < 1e-9))
        .map(|(k, v)| {
            let short = part(k).filter(|p| {
                s.rewards
                    .iter()
                    .filter(|(q, _)| part(q).as_ref() == Some(p))
                    .count()
                    == 1
            });
            (short.unwrap_or_else(|| k.clone()), *v)
        })
        .collect()
}

fn sample_html(out: &mut String, s: &Sample) {
    out.push_str("<div class=\"case\"><div class=\"meta\">");
    let _ = write!(out, "<span class=\"r\">reward {}</span>", fmt_num(s.reward));
    for (k, v) in reward_chips(s) {
        let _ = write!(
            out,
            "<span class=\"chip\">{} {}</span>",
            escape(&k),
            fmt_num(v)
        );
    }
    if let Some(a) = s.advantage {
        let _ = write!(out, "<span>advantage {}</span>", fmt_delta(a));
    }
    if let Some(t) = s.completion_tokens {
        let _ = write!(out, "<span>{t} tokens</span>");
    }
    if s.truncated == Some(true) {
        out.push_str("<span class=\"bad\">truncated</span>");
    }
    let _ = write!(
        out,
        "<span>{} &middot; step {}</span>",
        escape(&s.split),
        s.step
    );
    out.push_str("</div>\n");
    text_block(out, "p", "prompt", &s.prompt);
    text_block(out, "c", "completion", &s.completion);
    out.push_str("</div>\n");
}

/// The whole page.
pub fn render_html(card: &Card, svg: &str, cases: &[CaseGroup]) -> String {
    let mut out = String::with_capacity(svg.len() + 64 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{} - rlft report</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n",
        escape(&card.run_name)
    );
    card_html(&mut out, card);
    out.push_str("<h2>Dashboard</h2>\n<figure>\n");
    let svg = svg.trim_start();
    let svg = match svg.strip_prefix("<?xml") {
        Some(rest) => rest.split_once("?>").map_or(svg, |p| p.1),
        None => svg,
    };
    out.push_str(svg);
    out.push_str(
        "\n<figcaption>Thin lines: per-step values; thick: rolling mean; band: min-max; \
         diamonds: eval. Also in <a href=\"dashboard.png\">dashboard.png</a> and \
         <a href=\"dashboard.svg\">dashboard.svg</a>.</figcaption>\n</figure>\n",
    );
    out.push_str("<h2>Sample rollouts</h2>\n");
    if cases.is_empty() {
        out.push_str(
            "<p class=\"about\">No samples logged (samples.jsonl is missing or empty).</p>\n",
        );
    }
    for g in cases {
        let _ = writeln!(
            out,
            "<h3>{}</h3>\n<p class=\"about\">{}</p>\n<div class=\"cases\">",
            escape(&g.title),
            escape(&g.about)
        );
        for s in &g.samples {
            sample_html(&mut out, s);
        }
        out.push_str("</div>\n");
    }
    out.push_str(
        "<footer>Written by <code>rlft report</code> from metrics.jsonl, samples.jsonl, \
         run_summary.json and config.toml.</footer>\n</main>\n</body>\n</html>\n",
    );
    out
}
