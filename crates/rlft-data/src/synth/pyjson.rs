//! JSON text exactly as Python's `json.dumps(value)` writes it, so JSONL files written here
//! match those of Python scripts byte for byte.
//!
//! `serde_json` writes `{"a":1}`; Python writes `{"a": 1}`. The rules of `json.dumps` with its
//! default arguments (`separators=(", ", ": ")`, no indent, keys in insertion order):
//!
//! - strings: `"` and `\` escaped, `\n \r \t \b \f` by their short forms, other characters below
//!   U+0020 as `\u00XX` (lowercase hex); with `ensure_ascii` (Python's default) also DEL and
//!   every non-ASCII character as `\uXXXX`, characters above U+FFFF as a surrogate pair;
//! - integers as decimal; floats as Python's `repr`: the shortest digits that round-trip, in
//!   fixed notation with at least one decimal (`26.0`) when the decimal exponent is in
//!   `-4..16`, else `1e+16` / `1e-05` style;
//! - `true`, `false`, `null`; `[]` and `{}` when empty.

use serde_json::{Number, Value};

/// `json.dumps(value, ensure_ascii=ensure_ascii)` (Python's other defaults).
pub fn python_json_dumps(value: &Value, ensure_ascii: bool) -> String {
    let mut out = String::new();
    write_value(&mut out, value, ensure_ascii);
    out
}

fn write_value(out: &mut String, value: &Value, ascii: bool) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s, ascii),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item, ascii);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(out, key, ascii);
                out.push_str(": ");
                write_value(out, item, ascii);
            }
            out.push('}');
        }
    }
}

fn write_number(out: &mut String, n: &Number) {
    if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(f) = n.as_f64() {
        out.push_str(&python_float_repr(f));
    } else {
        out.push_str(&n.to_string()); // arbitrary precision numbers: as written
    }
}

/// Python's `repr(f)` for a float.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into(); // what json.dumps writes (allow_nan=True)
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, like Python's repr: `-1.25e-7`.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // Python's `decpt`: the value is 0.DIGITS x 10^decpt.
    let decpt = exp + 1;
    let body = if (-3..=16).contains(&decpt) {
        let nd = digits.len() as i32;
        if decpt <= 0 {
            format!("0.{}{digits}", "0".repeat((-decpt) as usize))
        } else if decpt >= nd {
            format!("{digits}{}.0", "0".repeat((decpt - nd) as usize))
        } else {
            let (int, frac) = digits.split_at(decpt as usize);
            format!("{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let e_sign = if exp < 0 { '-' } else { '+' };
        format!("{first}{frac}e{e_sign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

fn write_string(out: &mut String, s: &str, ascii: bool) {
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
            c if (c as u32) < 0x20 || (ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn matches_python_json_dumps() {
        // Printed by Python 3.11: json.dumps(v) and json.dumps(v, ensure_ascii=False).
        let v = json!({
            "a": [1, 2.5, 1e16, 1e-5, 0.0001, -0.0, 1234567890123456.0, 1e22, 123456789.123,
                  5e-324, 1.7976931348623157e308],
            "é\"\\\n\t\u{8}\u{c}\u{1}\u{7f}": "snow☃ 😀 /",
            "e": {}, "f": [], "n": null, "t": true, "big": i64::MAX, "neg": -5
        });
        assert_eq!(
            python_json_dumps(&v, true),
            r#"{"a": [1, 2.5, 1e+16, 1e-05, 0.0001, -0.0, 1234567890123456.0, 1e+22, 123456789.123, 5e-324, 1.7976931348623157e+308], "\u00e9\"\\\n\t\b\f\u0001\u007f": "snow\u2603 \ud83d\ude00 /", "e": {}, "f": [], "n": null, "t": true, "big": 9223372036854775807, "neg": -5}"#
        );
        let s = json!({"a": "é\"\\\n\t\u{8}\u{c}\u{1}\u{7f} snow☃ 😀 /"});
        assert_eq!(
            python_json_dumps(&s, false),
            "{\"a\": \"é\\\"\\\\\\n\\t\\b\\f\\u0001\u{7f} snow☃ 😀 /\"}"
        );
    }

    #[test]
    fn float_repr_boundaries() {
        for (f, want) in [
            (0.0, "0.0"),
            (26.0, "26.0"),
            (0.1, "0.1"),
            (1e15, "1000000000000000.0"),
            (9999999999999998.0, "9999999999999998.0"),
            (1e-4, "0.0001"),
            (1.5e-5, "1.5e-05"),
            (-2.5e100, "-2.5e+100"),
        ] {
            assert_eq!(python_float_repr(f), want, "{f}");
        }
    }
}
