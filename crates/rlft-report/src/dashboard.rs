//! The reward dashboard: a grid of panels (reward, each reward component, response length, KL,
//! groups with zero reward std) drawn with plotters, to PNG (bitmap backend into a buffer,
//! encoded with `png`) and to SVG, from one drawing function.
//!
//! Every panel shares the step axis. Per-step values are a thin light line (broken where a
//! value is NaN/inf), the rolling mean a thick line of the same hue, eval points dark diamonds
//! with their value, and response length a min-max band around the mean.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::card::Card;
use crate::error::ReportError;
use crate::font::{ensure_fonts, FAMILY};
use crate::run::RunData;
use crate::stats::{reward_components, rolling_mean, rolling_window, series, Points};
use crate::text::CrispText;

/// Width of the dashboard in pixels.
pub const WIDTH: u32 = 1400;
const HEADER: u32 = 92;
const ROW: u32 = 360;
const FOOTER: u32 = 8;
const COLS: usize = 2;

const INK: RGBColor = RGBColor(17, 24, 39);
const MUTED: RGBColor = RGBColor(100, 110, 125);
const GRID: RGBColor = RGBColor(218, 222, 228);
const GRID_LIGHT: RGBColor = RGBColor(240, 242, 245);
const AXIS: RGBColor = RGBColor(150, 156, 166);
const EVAL: RGBColor = RGBColor(31, 41, 55);
const REWARD: RGBColor = RGBColor(37, 99, 235);
const COMPONENTS: [RGBColor; 5] = [
    RGBColor(13, 148, 136),
    RGBColor(124, 58, 237),
    RGBColor(217, 119, 6),
    RGBColor(219, 39, 119),
    RGBColor(8, 145, 178),
];
const LENGTH: RGBColor = RGBColor(22, 163, 74);
const KL: RGBColor = RGBColor(234, 88, 12);
const ZERO_STD: RGBColor = RGBColor(100, 116, 139);

/// One chart of the dashboard.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Caption.
    pub title: String,
    /// Y axis label.
    pub y_label: String,
    /// Line colour.
    pub color: RGBColor,
    /// Per-step values.
    pub raw: Points,
    /// Whether to draw the rolling mean over `raw`.
    pub smooth: bool,
    /// `(step, low, high)` band drawn behind the line.
    pub band: Vec<(f64, f64, f64)>,
    /// Eval points.
    pub eval: Points,
    /// Use `[0, 1]` as the y range when every value fits in it.
    pub unit: bool,
    /// Shown instead of a chart when nothing was logged.
    pub empty_note: String,
}

/// The whole dashboard, ready to draw.
#[derive(Debug, Clone)]
pub struct Dashboard {
    /// First header line.
    pub title: String,
    /// Second header line.
    pub subtitle: String,
    /// The panels, row by row, two per row.
    pub panels: Vec<Panel>,
    /// Rolling-mean window in logged points.
    pub window: usize,
    /// Shared step range.
    pub x_range: (f64, f64),
}

fn light(c: RGBColor) -> RGBColor {
    let mix = |v: u8| (v as f64 + (255.0 - v as f64) * 0.55) as u8;
    RGBColor(mix(c.0), mix(c.1), mix(c.2))
}

fn panel(title: &str, y_label: &str, color: RGBColor, raw: Points, eval: Points) -> Panel {
    Panel {
        title: title.into(),
        y_label: y_label.into(),
        color,
        raw,
        smooth: true,
        band: Vec::new(),
        eval,
        unit: false,
        empty_note: "not logged".into(),
    }
}

/// Lays out the dashboard of a run.
pub fn build_dashboard(run: &RunData, card: &Card) -> Dashboard {
    let m = &run.metrics;
    let last_step = run.global_step.or(m.iter().map(|r| r.step).max());
    // Eval points: the eval lines, plus run_summary's evals before training (at step 0) and
    // after it (at the last step) where no eval line has them.
    let eval = |key: &str| -> Points {
        let mut pts: Points = series(m, key)
            .into_iter()
            .filter(|p| p.1.is_finite())
            .collect();
        let initial = run.eval_initial.as_ref().and_then(|e| e.get(key));
        if let Some(&v) = initial.filter(|v| v.is_finite()) {
            if !pts.iter().any(|p| p.0 <= 0.0) {
                pts.insert(0, (0.0, v));
            }
        }
        let last = last_step.map(|s| s as f64);
        let fin = run.eval_final.as_ref().and_then(|e| e.get(key));
        if let (Some(&v), Some(x)) = (fin.filter(|v| v.is_finite()), last) {
            if !pts.iter().any(|p| p.0 == x) {
                pts.push((x, v));
            }
        }
        pts
    };
    let mut panels = vec![Panel {
        unit: true,
        ..panel(
            "Reward",
            "mean reward",
            REWARD,
            series(m, "reward"),
            eval("eval/reward"),
        )
    }];
    for (i, c) in reward_components(m).iter().enumerate() {
        panels.push(Panel {
            unit: true,
            ..panel(
                &format!("Reward: {}", c.label),
                "mean",
                COMPONENTS[i % COMPONENTS.len()],
                series(m, &c.key),
                eval(&c.eval_key),
            )
        });
    }
    let (mins, maxs) = (
        series(m, "completions/min_length"),
        series(m, "completions/max_length"),
    );
    let band = mins
        .iter()
        .filter_map(|&(x, lo)| {
            let hi = maxs.iter().find(|p| p.0 == x)?.1;
            (lo.is_finite() && hi.is_finite()).then_some((x, lo, hi))
        })
        .collect();
    panels.push(Panel {
        smooth: false,
        band,
        ..panel(
            "Response length",
            "tokens",
            LENGTH,
            series(m, "completions/mean_length"),
            eval("eval/completions/mean_length"),
        )
    });
    panels.push(Panel {
        empty_note: "no KL logged (beta = 0: no reference model)".into(),
        ..panel("KL to reference", "KL", KL, series(m, "kl"), Vec::new())
    });
    let zero = series(m, "frac_reward_zero_std");
    if !zero.is_empty() {
        panels.push(Panel {
            unit: true,
            ..panel(
                "Groups with zero reward std (no signal)",
                "fraction",
                ZERO_STD,
                zero,
                Vec::new(),
            )
        });
    }

    let eval_steps = panels.iter().flat_map(|p| p.eval.iter().map(|q| q.0));
    let steps = m.iter().map(|r| r.step as f64).chain(eval_steps);
    let (lo, hi) = steps.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), s| {
        (a.min(s), b.max(s))
    });
    let n_reward = panels[0].raw.iter().filter(|p| p.1.is_finite()).count();
    let mut subtitle = vec![card.model.clone().unwrap_or_else(|| "model unknown".into())];
    subtitle.push(card.status.label().to_owned());
    let plural = if m.len() == 1 { "" } else { "s" };
    subtitle.push(format!("{} logged line{plural}", m.len()));
    subtitle.push(format!("step {lo:.0} to {hi:.0}"));
    Dashboard {
        title: format!("GRPO run: {}", card.run_name),
        subtitle: subtitle.join("  \u{2022}  "),
        panels,
        window: rolling_window(n_reward),
        x_range: (lo, hi),
    }
}

impl Dashboard {
    /// Size in pixels of the PNG (and the SVG's view box).
    pub fn size(&self) -> (u32, u32) {
        let rows = self.panels.len().div_ceil(COLS) as u32;
        (WIDTH, HEADER + rows * ROW + FOOTER)
    }

    /// The dashboard as an SVG document.
    pub fn render_svg(&self) -> Result<String, ReportError> {
        ensure_fonts().map_err(ReportError::Plot)?;
        let mut svg = String::new();
        {
            let backend = SVGBackend::with_string(&mut svg, self.size());
            let root = CrispText::new(backend, false).into_drawing_area();
            self.draw(&root).map_err(ReportError::Plot)?;
            root.present()
                .map_err(|e| ReportError::Plot(e.to_string()))?;
        }
        Ok(svg)
    }

    /// The dashboard as PNG bytes (8-bit RGB).
    pub fn render_png(&self) -> Result<Vec<u8>, ReportError> {
        ensure_fonts().map_err(ReportError::Plot)?;
        let (w, h) = self.size();
        let mut rgb = vec![255u8; (w * h * 3) as usize];
        {
            let backend = BitMapBackend::with_buffer(&mut rgb, (w, h));
            let root = CrispText::new(backend, true).into_drawing_area();
            self.draw(&root).map_err(ReportError::Plot)?;
            root.present()
                .map_err(|e| ReportError::Plot(e.to_string()))?;
        }
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header()?;
        writer.write_image_data(&rgb)?;
        writer.finish()?;
        Ok(out)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(s)?;
        let (header, body) = root.split_vertically(HEADER);
        self.draw_header(&header)?;
        let rows = self.panels.len().div_ceil(COLS);
        let body = body.margin(0, FOOTER, 0, 0);
        let cells = body.split_evenly((rows, COLS));
        for (cell, panel) in cells.iter().zip(&self.panels) {
            draw_panel(cell, panel, self.x_range, self.window)?;
        }
        Ok(())
    }

    fn draw_header<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let title = (FAMILY, 26, FontStyle::Bold).into_font().color(&INK);
        let sub = (FAMILY, 15).into_font().color(&MUTED);
        area.draw(&Text::new(self.title.clone(), (28, 18), title))
            .map_err(s)?;
        area.draw(&Text::new(self.subtitle.clone(), (28, 56), sub.clone()))
            .map_err(s)?;
        // Legend, right-aligned: swatch then label, for each mark the panels use.
        let rolling = format!("rolling mean ({} steps)", self.window);
        let smoothed = self
            .panels
            .iter()
            .any(|p| p.smooth && finite_count(&p.raw) >= 4);
        let banded = self.panels.iter().any(|p| !p.band.is_empty());
        let evals = self.panels.iter().any(|p| !p.eval.is_empty());
        let items: Vec<(&str, u8)> = [
            (Some("per step"), 0),
            (smoothed.then_some(rolling.as_str()), 1),
            (banded.then_some("min-max"), 2),
            (evals.then_some("eval"), 3),
        ]
        .into_iter()
        .filter_map(|(t, k)| Some((t?, k)))
        .collect();
        let width = |t: &str| area.estimate_text_size(t, &sub).map_or(80, |s| s.0 as i32);
        let total: i32 = items.iter().map(|(t, _)| 34 + width(t) + 22).sum();
        let (mut x, y) = (WIDTH as i32 - 28 - total, 66);
        let gray = RGBColor(90, 98, 110);
        for (text, kind) in items {
            let mark: Result<(), _> = match kind {
                0 => area.draw(&PathElement::new(
                    vec![(x, y), (x + 26, y)],
                    light(gray).stroke_width(2),
                )),
                1 => area.draw(&PathElement::new(
                    vec![(x, y), (x + 26, y)],
                    gray.stroke_width(4),
                )),
                2 => area.draw(&Rectangle::new(
                    [(x, y - 7), (x + 26, y + 7)],
                    gray.mix(0.18).filled(),
                )),
                _ => draw_diamond(area, (x + 13, y)),
            };
            mark.map_err(s)?;
            let style = sub.clone().pos(Pos::new(HPos::Left, VPos::Center));
            area.draw(&Text::new(text.to_owned(), (x + 34, y), style))
                .map_err(s)?;
            x += 34 + width(text) + 22;
        }
        area.draw(&PathElement::new(
            vec![
                (28, HEADER as i32 - 2),
                (WIDTH as i32 - 28, HEADER as i32 - 2),
            ],
            GRID.stroke_width(1),
        ))
        .map_err(s)
    }
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn draw_diamond<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let pts = |r: i32| vec![(x, y - r), (x + r, y), (x, y + r), (x - r, y)];
    area.draw(&Polygon::new(pts(8), WHITE.filled()))?;
    area.draw(&Polygon::new(pts(6), EVAL.filled()))
}

/// The y range of a panel: every finite value, padded; `[0, 1]` for unit panels that fit.
fn y_range(p: &Panel) -> (f64, f64) {
    let band = p.band.iter().flat_map(|b| [b.1, b.2]);
    let vals = p.raw.iter().chain(&p.eval).map(|q| q.1).chain(band);
    let (lo, hi) = vals
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if p.unit && lo >= 0.0 && hi <= 1.0 {
        return (-0.04, 1.08);
    }
    let span = hi - lo;
    let pad = if span > 0.0 {
        span * 0.1
    } else {
        (hi.abs() * 0.1).max(1e-3)
    };
    let lo = if lo >= 0.0 && lo - pad < 0.0 {
        0.0
    } else {
        lo - pad
    };
    (lo, hi + pad * 1.5)
}

/// Tick labels with as many decimals as the axis span needs (scientific for tiny values).
fn tick_label(v: f64, span: f64, max_abs: f64) -> String {
    let v = if v.abs() < span * 1e-9 { 0.0 } else { v };
    if max_abs < 0.01 {
        if v == 0.0 {
            return "0".into();
        }
        return format!("{v:.1e}");
    }
    let decimals = (-(span / 5.0).log10()).ceil().clamp(0.0, 4.0) as usize;
    format!("{v:.decimals$}")
}

fn finite_count(points: &[(f64, f64)]) -> usize {
    points.iter().filter(|q| q.1.is_finite()).count()
}

/// Runs of consecutive finite points: a NaN breaks the line.
fn segments(points: &[(f64, f64)]) -> Vec<Vec<(f64, f64)>> {
    points
        .split(|p| !p.1.is_finite())
        .filter(|s| !s.is_empty())
        .map(<[_]>::to_vec)
        .collect()
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
    (x0, x1): (f64, f64),
    window: usize,
) -> Result<(), String> {
    let caption = (FAMILY, 18, FontStyle::Bold).into_font().color(&INK);
    let area = area.margin(6, 4, 14, 22);
    let finite = p.raw.iter().any(|q| q.1.is_finite()) || !p.eval.is_empty();
    if !finite {
        let inner = area.titled(&p.title, caption).map_err(s)?;
        let (w, h) = inner.dim_in_pixel();
        inner
            .draw(&Rectangle::new(
                [(0, 0), (w as i32 - 1, h as i32 - 1)],
                GRID,
            ))
            .map_err(s)?;
        let note = (FAMILY, 16)
            .into_font()
            .color(&MUTED)
            .pos(Pos::new(HPos::Center, VPos::Center));
        return inner
            .draw(&Text::new(
                p.empty_note.clone(),
                (w as i32 / 2, h as i32 / 2),
                note,
            ))
            .map_err(s);
    }
    // At least 4 steps wide, so a short run still gets whole-step ticks.
    let x1 = x1.max(x0 + 4.0);
    let pad = ((x1 - x0) * 0.02).max(0.5);
    let (y0, y1) = y_range(p);
    let (span, max_abs) = (y1 - y0, y0.abs().max(y1.abs()));
    let mut chart = ChartBuilder::on(&area)
        .caption(&p.title, caption)
        .x_label_area_size(44)
        .y_label_area_size(66)
        .build_cartesian_2d((x0 - pad)..(x1 + pad), y0..y1)
        .map_err(s)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(&p.y_label)
        .x_labels(8)
        .y_labels(6)
        .max_light_lines(1)
        .bold_line_style(GRID.stroke_width(1))
        .light_line_style(GRID_LIGHT.stroke_width(1))
        .axis_style(AXIS.stroke_width(1))
        .label_style((FAMILY, 14).into_font().color(&MUTED))
        .axis_desc_style((FAMILY, 15).into_font().color(&MUTED))
        .x_label_formatter(&|x| {
            // Steps are whole numbers: no label on a fractional tick.
            if (x - x.round()).abs() < 1e-6 {
                format!("{:.0}", x.round() + 0.0)
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| tick_label(*y, span, max_abs))
        .draw()
        .map_err(s)?;
    if !p.band.is_empty() {
        let mut poly: Vec<(f64, f64)> = p.band.iter().map(|b| (b.0, b.2)).collect();
        poly.extend(p.band.iter().rev().map(|b| (b.0, b.1)));
        chart
            .draw_series(std::iter::once(Polygon::new(
                poly,
                p.color.mix(0.16).filled(),
            )))
            .map_err(s)?;
    }
    let raw_style = if p.smooth {
        light(p.color).stroke_width(2)
    } else {
        p.color.stroke_width(3)
    };
    for seg in segments(&p.raw) {
        if let [only] = seg[..] {
            // A lone point (one step, or between two NaNs) has no line: a dot.
            let dot = Circle::new(only, 4, p.color.filled());
            chart.draw_series(std::iter::once(dot)).map_err(s)?;
        } else {
            chart
                .draw_series(LineSeries::new(seg, raw_style))
                .map_err(s)?;
        }
    }
    let n = finite_count(&p.raw);
    if p.smooth && n >= 4 {
        chart
            .draw_series(LineSeries::new(
                rolling_mean(&p.raw, window),
                p.color.stroke_width(3),
            ))
            .map_err(s)?;
    }
    let label = (FAMILY, 13, FontStyle::Bold)
        .into_font()
        .color(&EVAL)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    for &(x, y) in &p.eval {
        let (px, py) = chart.backend_coord(&(x, y));
        let plot = chart.plotting_area().strip_coord_spec();
        draw_diamond(
            &plot,
            (px - plot.get_base_pixel().0, py - plot.get_base_pixel().1),
        )
        .map_err(s)?;
        let text = crate::stats::fmt_num(y);
        plot.draw(&Text::new(
            text,
            (
                px - plot.get_base_pixel().0,
                py - plot.get_base_pixel().1 - 10,
            ),
            label.clone(),
        ))
        .map_err(s)?;
    }
    Ok(())
}
