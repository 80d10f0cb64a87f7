//! Text for the PNG: a backend wrapper that lays glyphs out itself.
//!
//! plotters 0.3.7's `ab_glyph` text drops each glyph's left side bearing and truncates the
//! advance to whole pixels (uneven letter spacing: "form at"), and `FontDesc::style` keeps the
//! regular face when asked for bold. [`CrispText`] forwards everything to the wrapped backend
//! but draws text (when `raster` is set) and measures it with ab_glyph directly: sub-pixel
//! glyph positions with their bearings, the bold face for bold styles, the same em size as the
//! SVG writes (`size / 1.24` px), plotters' anchors and rotations. Measuring is overridden for
//! the SVG too, so both outputs get the same layout.

use ab_glyph::{Font, FontRef, GlyphId, PxScale, ScaleFont};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
    FontStyle,
};

use crate::font::face;

/// A [`DrawingBackend`] that draws and measures text with the embedded font.
pub struct CrispText<B> {
    inner: B,
    raster: bool,
}

impl<B> CrispText<B> {
    /// Wraps `inner`; `raster`: draw text as pixels (bitmaps) rather than leave it to `inner`
    /// (SVG, which writes `<text>`).
    pub fn new(inner: B, raster: bool) -> Self {
        CrispText { inner, raster }
    }
}

/// A line of text laid out: glyphs with their x positions and the line's metrics, in pixels.
struct Line {
    scale: PxScale,
    glyphs: Vec<(GlyphId, f32)>,
    width: f32,
    ascent: f32,
    descent: f32,
}

fn layout(font: &FontRef<'static>, size: f64, text: &str) -> Line {
    // `size / 1.24` px per em, as plotters' SVG writes `font-size`.
    let em = size as f32 / 1.24;
    let units = font.units_per_em().unwrap_or(2048.0);
    let scale = PxScale::from(em * font.height_unscaled() / units);
    let sf = font.as_scaled(scale);
    let (mut caret, mut prev, mut glyphs) = (0.0f32, None, Vec::new());
    for c in text.chars() {
        let id = sf.glyph_id(c);
        if let Some(p) = prev {
            caret += sf.kern(p, id);
        }
        glyphs.push((id, caret));
        caret += sf.h_advance(id);
        prev = Some(id);
    }
    Line {
        scale,
        glyphs,
        width: caret,
        ascent: sf.ascent(),
        descent: sf.descent(),
    }
}

fn font_for<S: BackendTextStyle>(style: &S) -> &'static FontRef<'static> {
    face(matches!(style.style(), FontStyle::Bold))
}

impl<B: DrawingBackend> DrawingBackend for CrispText<B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        let line = layout(font_for(style), style.size(), text);
        Ok((
            line.width.ceil() as u32,
            (line.ascent - line.descent).ceil() as u32,
        ))
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let color = style.color();
        if !self.raster {
            return self.inner.draw_text(text, style, pos);
        }
        if color.alpha == 0.0 {
            return Ok(());
        }
        let font = font_for(style);
        let line = layout(font, style.size(), text);
        let (w, h) = (line.width, line.ascent - line.descent);
        let anchor = style.anchor();
        let dx = match anchor.h_pos {
            HPos::Left => 0.0,
            HPos::Center => -w / 2.0,
            HPos::Right => -w,
        };
        let dy = match anchor.v_pos {
            VPos::Top => 0.0,
            VPos::Center => -h / 2.0,
            VPos::Bottom => -h,
        };
        let trans = style.transform();
        let mut result = Ok(());
        for (id, x) in line.glyphs {
            let at = ab_glyph::point(x + dx, line.ascent + dy);
            let glyph = id.with_scale_and_position(line.scale, at);
            let Some(outline) = font.outline_glyph(glyph) else {
                continue;
            };
            let b = outline.px_bounds();
            outline.draw(|gx, gy, coverage| {
                if result.is_err() || coverage <= 0.0 {
                    return;
                }
                let (px, py) =
                    trans.transform(b.min.x as i32 + gx as i32, b.min.y as i32 + gy as i32);
                let c = BackendColor {
                    alpha: color.alpha * coverage.min(1.0) as f64,
                    rgb: color.rgb,
                };
                result = self.inner.draw_pixel((pos.0 + px, pos.1 + py), c);
            });
            std::mem::replace(&mut result, Ok(()))?;
        }
        Ok(())
    }
}
