//! Python's formatting of values, so that templates render byte-identically to Jinja2 in Python:
//! `json.dumps` (HF's `tojson` filter), `repr`/`str` of None, booleans, floats, lists and dicts
//! (what `{{ value }}` prints), and `datetime.strftime` (HF's `strftime_now`).

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::fmt::Write as _;

/// Options of Python's `json.dumps` that HF's `tojson` filter forwards.
#[derive(Debug, Clone)]
pub(crate) struct JsonOpts {
    /// `ensure_ascii`: escape every non-ASCII character as `\uXXXX` (HF's default is False).
    pub ensure_ascii: bool,
    /// `indent`: None = one line; Some(n) = newline + n spaces per level.
    pub indent: Option<String>,
    /// `separators`: (item separator, key separator).
    pub item_sep: String,
    pub key_sep: String,
    /// `sort_keys`.
    pub sort_keys: bool,
}

impl JsonOpts {
    /// Python's defaults for the given indent: `(', ', ': ')` on one line, `(',', ': ')` indented.
    pub fn new(indent: Option<String>) -> Self {
        let item_sep = if indent.is_some() { "," } else { ", " };
        JsonOpts {
            ensure_ascii: false,
            indent,
            item_sep: item_sep.into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "tojson: object of kind {} is not JSON serializable",
            value.kind()
        ),
    )
}

/// Map entries in iteration order (insertion order, as Python dicts), keys as strings.
fn map_entries(value: &Value) -> Result<Vec<(String, Value)>, Error> {
    let mut entries = Vec::new();
    for key in value.try_iter()? {
        let item = value.get_item(&key)?;
        let key = match key.as_str() {
            Some(s) => s.to_string(),
            // json.dumps turns None/True/False/numbers keys into strings like this.
            None if key.is_none() => "null".to_string(),
            None if key.kind() == ValueKind::Bool => key.is_true().to_string(),
            None => key.to_string(),
        };
        entries.push((key, item));
    }
    Ok(entries)
}

/// `json.dumps(value, ...)` exactly as Python writes it.
pub(crate) fn to_json(value: &Value, opts: &JsonOpts) -> Result<String, Error> {
    let mut out = String::new();
    write_json(value, opts, 0, &mut out)?;
    Ok(out)
}

fn newline_indent(opts: &JsonOpts, depth: usize, out: &mut String) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn write_json(value: &Value, opts: &JsonOpts, depth: usize, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(value, true, out),
        ValueKind::String => write_json_str(value.as_str().unwrap_or_default(), opts, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline_indent(opts, depth + 1, out);
                write_json(item, opts, depth + 1, out)?;
            }
            newline_indent(opts, depth, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = map_entries(value)?;
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline_indent(opts, depth + 1, out);
                write_json_str(k, opts, out);
                out.push_str(&opts.key_sep);
                write_json(v, opts, depth + 1, out)?;
            }
            newline_indent(opts, depth, out);
            out.push('}');
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

fn write_json_str(s: &str, opts: &JsonOpts, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if opts.ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{:04x}", unit);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Writes a number as Python does: ints plainly, floats as `repr(float)` (`1.0`, `1e-07`,
/// `1e+16`); in JSON mode non-finite floats are `NaN`/`Infinity`, in repr mode `nan`/`inf`.
fn write_number(value: &Value, json: bool, out: &mut String) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    match f64::try_from(value.clone()) {
        Ok(f) => out.push_str(&py_float(f, json)),
        Err(_) => {
            let _ = write!(out, "{value}");
        }
    }
}

/// `repr(f)` of a Python float (shortest round-trip digits; scientific below 1e-4 and from 1e16).
pub(crate) fn py_float(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if f < 0.0 { format!("-{s}") } else { s.into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python's repr.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // position of the decimal point within `digits`
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if (point as usize) >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    }
}

/// `repr(s)` of a Python str.
fn write_py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `str(value)` as Python prints it in `{{ value }}`: strings as is, `None`, `True`/`False`,
/// float repr, and lists/dicts in repr form (`['a', 1]`, `{'k': None}`).
pub(crate) fn write_py_str(value: &Value, out: &mut String) -> bool {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => return write_py_repr(value, out),
    }
    true
}

/// `repr(value)`. Returns false (writing nothing) for values with no Python equivalent (objects
/// such as `loop` or a namespace), which the caller formats the default way.
fn write_py_repr(value: &Value, out: &mut String) -> bool {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(value, false, out),
        ValueKind::String => write_py_str_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            let Ok(items) = value.try_iter() else {
                return false;
            };
            let mut buf = String::from("[");
            for (i, item) in items.enumerate() {
                if i > 0 {
                    buf.push_str(", ");
                }
                if !write_py_repr(&item, &mut buf) {
                    return false;
                }
            }
            buf.push(']');
            out.push_str(&buf);
        }
        ValueKind::Map => {
            let Ok(entries) = value.try_iter() else {
                return false;
            };
            let mut buf = String::from("{");
            for (i, key) in entries.enumerate() {
                if i > 0 {
                    buf.push_str(", ");
                }
                let Ok(item) = value.get_item(&key) else {
                    return false;
                };
                if !write_py_repr(&key, &mut buf) {
                    return false;
                }
                buf.push_str(": ");
                if !write_py_repr(&item, &mut buf) {
                    return false;
                }
            }
            buf.push('}');
            out.push_str(&buf);
        }
        _ => return false,
    }
    true
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Civil date (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's
/// algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Python's `datetime.strftime(fmt)` for a UTC time given as seconds since the Unix epoch.
///
/// Supports `%Y %y %m %d %e %B %b %h %A %a %H %I %M %S %p %j %w %u %F %T %D %%`; any other
/// directive is copied through unchanged (as glibc does for unknown ones).
pub(crate) fn strftime(fmt: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday; 0 = Monday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let month = MONTHS[(m - 1) as usize];
    let wname = WEEKDAYS[weekday];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match spec {
            'Y' => write!(out, "{y}"),
            'y' => write!(out, "{:02}", y.rem_euclid(100)),
            'm' => write!(out, "{m:02}"),
            'd' => write!(out, "{d:02}"),
            'e' => write!(out, "{d:>2}"),
            'B' => write!(out, "{month}"),
            'b' | 'h' => write!(out, "{}", &month[..3]),
            'A' => write!(out, "{wname}"),
            'a' => write!(out, "{}", &wname[..3]),
            'H' => write!(out, "{hh:02}"),
            'I' => write!(out, "{:02}", if hh % 12 == 0 { 12 } else { hh % 12 }),
            'M' => write!(out, "{mm:02}"),
            'S' => write!(out, "{ss:02}"),
            'p' => write!(out, "{}", if hh < 12 { "AM" } else { "PM" }),
            'j' => write!(out, "{yday:03}"),
            'w' => write!(out, "{}", (weekday + 1) % 7),
            'u' => write!(out, "{}", weekday + 1),
            'F' => write!(out, "{y}-{m:02}-{d:02}"),
            'T' => write!(out, "{hh:02}:{mm:02}:{ss:02}"),
            'D' => write!(out, "{m:02}/{d:02}/{:02}", y.rem_euclid(100)),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

/// Days since 1970-01-01 of a civil date (inverse of `civil_from_days`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.25e-7, "1.25e-07"),
            (1e100, "1e+100"),
            (100.0, "100.0"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float(f, true), want, "{f}");
        }
        assert_eq!(py_float(f64::NAN, true), "NaN");
        assert_eq!(py_float(f64::NEG_INFINITY, false), "-inf");
    }

    #[test]
    fn json_like_python() {
        let v = Value::from_serialize(serde_json::json!({
            "b": [1, 2.5, "x\"y\n", null, true],
            "a": {"é": "日本", "e": {}, "l": []}
        }));
        assert_eq!(
            to_json(&v, &JsonOpts::new(None)).unwrap(),
            r#"{"b": [1, 2.5, "x\"y\n", null, true], "a": {"é": "日本", "e": {}, "l": []}}"#
        );
        let mut opts = JsonOpts::new(Some("  ".into()));
        opts.sort_keys = true;
        assert_eq!(
            to_json(&v, &opts).unwrap(),
            "{\n  \"a\": {\n    \"e\": {},\n    \"l\": [],\n    \"é\": \"日本\"\n  },\n  \"b\": [\n    1,\n    2.5,\n    \"x\\\"y\\n\",\n    null,\n    true\n  ]\n}"
        );
        let mut ascii = JsonOpts::new(None);
        ascii.ensure_ascii = true;
        assert_eq!(
            to_json(&Value::from("é🤗"), &ascii).unwrap(),
            r#""\u00e9\ud83e\udd17""#
        );
    }

    #[test]
    fn repr_like_python() {
        let v = Value::from_serialize(serde_json::json!(["it's", "a\"b", 1.0, null, {"k": false}]));
        let mut out = String::new();
        assert!(write_py_str(&v, &mut out));
        assert_eq!(out, r#"["it's", 'a"b', 1.0, None, {'k': False}]"#);
    }

    #[test]
    fn strftime_like_python() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_721_999_109;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %e %j %H:%M:%S %p %I %y %%", t),
            "Friday July 26 208 13:05:09 PM 01 24 %"
        );
        assert_eq!(strftime("%F %T %u %w", 0), "1970-01-01 00:00:00 4 4");
        assert_eq!(strftime("%Y-%m-%d", 951_782_400), "2000-02-29");
    }
}
