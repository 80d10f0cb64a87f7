//! The font the charts are drawn with, embedded so a PNG has text on any machine.
//!
//! plotters' `ttf` feature finds system fonts through font-kit (fontconfig + FreeType, C
//! libraries that a bare container or CI image may lack, and output that changes with what is
//! installed). Instead the `ab_glyph` feature renders from font bytes we hand it: two subsets of
//! DejaVu Sans 2.37 (Book and Bold; Latin-1 plus a few symbols, 24 + 20 KB, renamed "rlft Report
//! Sans" as the Bitstream Vera licence asks of modified fonts; `assets/make_fonts.py` makes them,
//! `assets/LICENSE-DejaVu.txt` is their licence). The same PNG comes out everywhere. They are
//! registered under plotters' `sans-serif` family, so the SVG names `sans-serif` and a browser
//! uses its own sans-serif font. Characters outside the subset draw as the font's empty box;
//! chart text is ours (titles, numbers, reward names), so this is rare.

use std::sync::OnceLock;

use ab_glyph::FontRef;

use plotters::style::{register_font, FontStyle};

const BOOK: &[u8] = include_bytes!("../assets/rlft-report-sans.ttf");
const BOLD: &[u8] = include_bytes!("../assets/rlft-report-sans-bold.ttf");

/// The embedded face, bold or regular, for laying text out directly (see [`crate::text`]).
pub fn face(bold: bool) -> &'static FontRef<'static> {
    static FACES: OnceLock<(FontRef<'static>, FontRef<'static>)> = OnceLock::new();
    let (book, bold_face) = FACES.get_or_init(|| {
        (
            FontRef::try_from_slice(BOOK).expect("the embedded font parses (see the tests)"),
            FontRef::try_from_slice(BOLD).expect("the embedded bold font parses"),
        )
    });
    if bold {
        bold_face
    } else {
        book
    }
}

/// The family name the charts use.
pub const FAMILY: &str = "sans-serif";

/// Registers the embedded fonts with plotters (once per process).
pub fn ensure_fonts() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        register_font(FAMILY, FontStyle::Normal, BOOK)
            .map_err(|_| "the embedded font does not parse".to_owned())?;
        register_font(FAMILY, FontStyle::Bold, BOLD)
            .map_err(|_| "the embedded bold font does not parse".to_owned())
    })
    .clone()
}
