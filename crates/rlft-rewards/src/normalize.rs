//! Answer normalisation of the seed example (`tiny_python_expr`), with Python's `Decimal` parsing
//! and formatting reimplemented on digit strings (no floats, so `26.000` reads `26` and `0.1`
//! stays `0.1`).
//!
//! The reference is Python 3.11: `str.strip()` whitespace, `re`'s `\d` and `Decimal`'s Unicode
//! digits come from its Unicode 14.0 tables, `Decimal.normalize()` rounds to the default context
//! (28 significant digits, half-even, exponents within +-999999), and `str(int(v))` refuses
//! integers of more than 4300 digits. Where the literal Python rule raises instead of returning
//! (Infinity, sNaN, overflow, more than 4300 digits) the text is kept as is, like any unparsable
//! answer. `scripts/reference/python_expr_rule_cases.py` pins all of this.

/// First code point of each run of ten decimal digits (Unicode category Nd) in Python 3.11
/// (Unicode 14.0). Python's `re` `\d` and `Decimal()` accept exactly these.
const DIGIT_BLOCKS: [u32; 66] = [
    0x30, 0x660, 0x6f0, 0x7c0, 0x966, 0x9e6, 0xa66, 0xae6, 0xb66, 0xbe6, 0xc66, 0xce6, 0xd66,
    0xde6, 0xe50, 0xed0, 0xf20, 0x1040, 0x1090, 0x17e0, 0x1810, 0x1946, 0x19d0, 0x1a80, 0x1a90,
    0x1b50, 0x1bb0, 0x1c40, 0x1c50, 0xa620, 0xa8d0, 0xa900, 0xa9d0, 0xa9f0, 0xaa50, 0xabf0, 0xff10,
    0x104a0, 0x10d30, 0x11066, 0x110f0, 0x11136, 0x111d0, 0x112f0, 0x11450, 0x114d0, 0x11650,
    0x116c0, 0x11730, 0x118e0, 0x11950, 0x11c50, 0x11d50, 0x11da0, 0x16a60, 0x16ac0, 0x16b50,
    0x1d7ce, 0x1d7d8, 0x1d7e2, 0x1d7ec, 0x1d7f6, 0x1e140, 0x1e2f0, 0x1e950, 0x1fbf0,
];

/// Precision of Python's default decimal context.
const PREC: usize = 28;
/// Largest adjusted exponent of the default context.
const EMAX: i128 = 999_999;
/// Smallest adjusted exponent of a normal number in the default context.
const EMIN: i128 = -999_999;
/// Smallest exponent of a subnormal number in the default context (`EMIN - PREC + 1`).
const ETINY: i128 = EMIN - PREC as i128 + 1;
/// `Decimal(str)` builds its value exactly in libmpdec's maximum context; beyond these exponents
/// construction fails (InvalidOperation) and the text stays as is.
const CONSTRUCT_EMAX: i128 = 999_999_999_999_999_999;
const CONSTRUCT_ETINY: i128 = -1_999_999_999_999_999_997;
/// Python >= 3.11 refuses `str()` of integers with more digits than this.
const INT_MAX_STR_DIGITS: usize = 4300;

/// Python's `str.isspace()`: Unicode White_Space plus the ASCII separators U+001C..U+001F.
pub fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()` without arguments.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// The value of `c` as a decimal digit (Unicode category Nd, as Python 3.11 knows it).
pub fn decimal_digit(c: char) -> Option<u8> {
    let cp = c as u32;
    let i = DIGIT_BLOCKS.partition_point(|&start| start <= cp);
    let start = DIGIT_BLOCKS[i.checked_sub(1)?];
    (cp - start < 10).then(|| (cp - start) as u8)
}

/// A regex character class matching what Python 3.11's `\d` matches in a `str` pattern.
pub(crate) fn digit_class() -> String {
    let mut class = String::from("[");
    for start in DIGIT_BLOCKS {
        class.push_str(&format!("\\x{{{:x}}}-\\x{{{:x}}}", start, start + 9));
    }
    class.push(']');
    class
}

/// The seed's `normalize_answer`: strip, strip `$`, drop `,`, strip trailing `.`, then read it as a
/// Python `Decimal`: integral values print as `str(int(v))` (`26.0` -> `26`, `1e2` -> `100`, `-0`
/// -> `0`), others in fixed notation without trailing zeros (`0.50` -> `0.5`); text that is not a
/// number (or that Python's rule would raise on, like `Infinity`) is returned as is.
pub fn normalize_answer(text: &str) -> String {
    let raw = py_strip(text).trim_matches('$').replace(',', "");
    let raw = raw.trim_end_matches('.');
    if raw.is_empty() {
        return String::new();
    }
    match parse_decimal(raw).and_then(|d| d.python_text()) {
        Some(text) => text,
        None => raw.to_string(),
    }
}

/// A value as Python's `Decimal(str)` builds it.
#[derive(Debug, Clone, PartialEq)]
enum Decimal {
    /// `(-1)^negative * digits * 10^exp`; `digits` are ASCII digits without leading zeros (empty
    /// for zero).
    Finite {
        negative: bool,
        digits: Vec<u8>,
        exp: i128,
    },
    /// A quiet NaN with its payload digits (no leading zeros).
    NaN { negative: bool, payload: Vec<u8> },
    /// A signalling NaN: `normalize()` raises on it.
    SNaN,
    /// Plus or minus infinity: `int()` raises on it.
    Infinity,
}

/// `Decimal(text)`, or `None` where Python raises InvalidOperation.
fn parse_decimal(text: &str) -> Option<Decimal> {
    // CPython's numeric_as_ascii: strip whitespace, drop underscores, map Unicode digits to ASCII;
    // other non-ASCII whitespace becomes a space (which the grammar then rejects).
    let mut s = Vec::with_capacity(text.len());
    for c in py_strip(text).chars() {
        match c {
            '_' => {}
            '\u{1}'..='\u{7f}' => s.push(c as u8),
            c if is_py_space(c) => s.push(b' '),
            c => s.push(b'0' + decimal_digit(c)?),
        }
    }
    let (negative, rest) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, &s[..]),
    };
    let lower = rest.to_ascii_lowercase();
    if let Some(payload) = lower.strip_prefix(b"nan") {
        return all_digits(payload).then(|| Decimal::NaN {
            negative,
            payload: trim_zeros(payload),
        });
    }
    if let Some(payload) = lower.strip_prefix(b"snan") {
        return all_digits(payload).then_some(Decimal::SNaN);
    }
    if lower == b"inf" || lower == b"infinity" {
        return Some(Decimal::Infinity);
    }
    parse_finite(negative, rest)
}

fn all_digits(s: &[u8]) -> bool {
    s.iter().all(u8::is_ascii_digit)
}

fn trim_zeros(s: &[u8]) -> Vec<u8> {
    let first = s.iter().position(|&b| b != b'0').unwrap_or(s.len());
    s[first..].to_vec()
}

/// `digits [. [digits]] | . digits`, then optionally `e|E [+|-] digits`.
fn parse_finite(negative: bool, s: &[u8]) -> Option<Decimal> {
    let (mantissa, exponent) = match s.iter().position(|&b| b == b'e' || b == b'E') {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let (int, frac) = match mantissa.iter().position(|&b| b == b'.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, &mantissa[mantissa.len()..]),
    };
    if int.is_empty() && frac.is_empty() || !all_digits(int) || !all_digits(frac) {
        return None;
    }
    let mut exp: i128 = match exponent {
        None => 0,
        Some(e) => {
            let (sign, digits) = match e.first() {
                Some(b'-') => (-1, &e[1..]),
                Some(b'+') => (1, &e[1..]),
                _ => (1, e),
            };
            if digits.is_empty() || !all_digits(digits) {
                return None;
            }
            // Saturate far beyond anything valid: the verdict no longer depends on the value.
            let value = digits.iter().fold(0i128, |acc, &d| {
                (acc * 10 + i128::from(d - b'0')).min(10i128.pow(30))
            });
            sign * value
        }
    };
    exp -= frac.len() as i128;
    let mut all = int.to_vec();
    all.extend_from_slice(frac);
    let digits = trim_zeros(&all);
    let adjusted = exp + digits.len().max(1) as i128 - 1;
    if exp < CONSTRUCT_ETINY || adjusted > CONSTRUCT_EMAX {
        return None;
    }
    Some(Decimal::Finite {
        negative,
        digits,
        exp,
    })
}

impl Decimal {
    /// What the seed's rule prints for this value after `normalize()`, or `None` where it raises.
    fn python_text(self) -> Option<String> {
        match self {
            Decimal::SNaN | Decimal::Infinity => None,
            Decimal::NaN { negative, payload } => {
                // normalize() keeps the low PREC digits of the payload; then `rstrip("0")`.
                let keep = &payload[payload.len().saturating_sub(PREC)..];
                let keep = trim_zeros(keep);
                let mut out = String::from(if negative { "-NaN" } else { "NaN" });
                out.push_str(std::str::from_utf8(&keep).ok()?);
                Some(out.trim_end_matches('0').to_string())
            }
            Decimal::Finite {
                negative,
                digits,
                exp,
            } => {
                let (digits, exp) = finalize(digits, exp)?;
                fixed_notation(negative, &digits, exp)
            }
        }
    }
}

/// `Decimal.normalize()` in the default context: round to 28 digits (or to the subnormal
/// exponent), reject overflow, then drop trailing zeros. Returns `None` on overflow.
fn finalize(mut digits: Vec<u8>, mut exp: i128) -> Option<(Vec<u8>, i128)> {
    if digits.is_empty() {
        return Some((digits, 0));
    }
    let adjusted = exp + digits.len() as i128 - 1;
    if adjusted > EMAX {
        return None;
    }
    if adjusted < EMIN {
        if exp < ETINY {
            let shift = usize::try_from(ETINY - exp).unwrap_or(usize::MAX);
            digits = round_half_even(&digits, shift);
            exp = ETINY;
        }
    } else if digits.len() > PREC {
        let shift = digits.len() - PREC;
        digits = round_half_even(&digits, shift);
        exp += shift as i128;
        if digits.len() > PREC {
            digits.pop(); // a carry made 10^PREC: one more zero off the end
            exp += 1;
        }
        if exp + digits.len() as i128 - 1 > EMAX {
            return None;
        }
    }
    while digits.last() == Some(&b'0') {
        digits.pop();
        exp += 1;
    }
    if digits.is_empty() {
        exp = 0;
    }
    Some((digits, exp))
}

/// Drops the `shift` lowest digits, rounding half to even. The result has no leading zeros
/// (empty for zero).
fn round_half_even(digits: &[u8], shift: usize) -> Vec<u8> {
    if shift == 0 {
        return digits.to_vec();
    }
    if shift > digits.len() {
        return Vec::new(); // less than half of the last kept unit
    }
    let (kept, dropped) = digits.split_at(digits.len() - shift);
    let first = dropped[0];
    let rest_nonzero = dropped[1..].iter().any(|&d| d != b'0');
    let odd = kept.last().is_some_and(|&d| (d - b'0') % 2 == 1);
    let mut kept = kept.to_vec();
    if first > b'5' || first == b'5' && (rest_nonzero || odd) {
        let mut i = kept.len();
        loop {
            if i == 0 {
                kept.insert(0, b'1');
                break;
            }
            i -= 1;
            if kept[i] == b'9' {
                kept[i] = b'0';
            } else {
                kept[i] += 1;
                break;
            }
        }
    }
    trim_zeros(&kept)
}

/// `str(int(v))` when `v` is integral (`None` past Python's 4300-digit limit), else
/// `format(v, "f")`: `digits * 10^exp` without trailing zeros.
fn fixed_notation(negative: bool, digits: &[u8], exp: i128) -> Option<String> {
    if digits.is_empty() {
        return Some("0".to_string());
    }
    let sign = if negative { "-" } else { "" };
    let body = std::str::from_utf8(digits).ok()?;
    if exp >= 0 {
        let zeros = usize::try_from(exp).ok()?;
        if digits.len().checked_add(zeros)? > INT_MAX_STR_DIGITS {
            return None;
        }
        return Some(format!("{sign}{body}{}", "0".repeat(zeros)));
    }
    let point = digits.len() as i128 + exp; // digits before the decimal point
    if point > 0 {
        let (int, frac) = body.split_at(point as usize);
        Some(format!("{sign}{int}.{frac}"))
    } else {
        let zeros = usize::try_from(-point).ok()?;
        Some(format!("{sign}0.{}{body}", "0".repeat(zeros)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_examples() {
        for (input, want) in [
            ("26", "26"),
            ("26.000", "26"),
            ("1e2", "100"),
            ("0.50", "0.5"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("+5", "5"),
            ("1_000", "1000"),
            (" $26.$ ", "26"),
            ("1,000", "1000"),
            ("abc", "abc"),
            ("", ""),
            ("...", ""),
            ("1.5e-3", "0.0015"),
            ("-1.234e-7", "-0.0000001234"),
            ("Infinity", "Infinity"),
            ("nan", "NaN"),
            ("-nan", "-NaN"),
            ("NaN00120", "NaN12"),
            ("sNaN", "sNaN"),
            (
                "12345678901234567890123456789",
                "12345678901234567890123456790",
            ),
            (
                "12345678901234567890123456785",
                "12345678901234567890123456780",
            ),
            ("0.99999999999999999999999999999", "1"),
            ("1e4299", &format!("1{}", "0".repeat(4299))),
            ("1e4300", "1e4300"),
            ("1e999999", "1e999999"),
            ("1e1000000", "1e1000000"),
            ("5e-1000027", "0"),
            ("\u{663}\u{662}", "32"),
            ("\u{ff11}\u{ff12}", "12"),
            ("1 2", "1 2"),
            ("_ 1", "_ 1"),
            ("1 _", "1 _"),
            ("1\u{0}", "1\u{0}"),
        ] {
            assert_eq!(normalize_answer(input), want, "input {input:?}");
        }
    }

    #[test]
    fn subnormal_output_is_exact() {
        let out = normalize_answer("6e-1000027");
        assert_eq!(out.len(), 1_000_028);
        assert!(out.starts_with("0.000") && out.ends_with("01"));
    }

    #[test]
    fn digits_and_spaces() {
        assert_eq!(decimal_digit('7'), Some(7));
        assert_eq!(decimal_digit('\u{1d7d8}'), Some(0));
        assert_eq!(decimal_digit('\u{1d7e1}'), Some(9));
        assert_eq!(decimal_digit('\u{b2}'), None); // superscript two is No, not Nd
        assert_eq!(decimal_digit('a'), None);
        assert_eq!(decimal_digit('\u{0}'), None);
        assert!(is_py_space('\u{1c}') && is_py_space('\u{3000}') && !is_py_space('\u{200b}'));
        assert_eq!(py_strip("\u{1f} x \u{85}"), "x");
        let class = regex::Regex::new(&format!("^{}+$", digit_class())).unwrap();
        assert!(class.is_match("0123\u{663}\u{ff19}") && !class.is_match("\u{b2}"));
    }

    #[test]
    fn rounding() {
        assert_eq!(round_half_even(b"25", 1), b"2");
        assert_eq!(round_half_even(b"35", 1), b"4");
        assert_eq!(round_half_even(b"251", 2), b"3");
        assert_eq!(round_half_even(b"999", 2), b"10");
        assert_eq!(round_half_even(b"5", 1), b"");
        assert_eq!(round_half_even(b"6", 1), b"1");
        assert_eq!(round_half_even(b"6", 2), b"");
    }
}
