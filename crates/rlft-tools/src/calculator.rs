//! The built-in `calculator` tool: parses an arithmetic expression and computes it with
//! Python's rules (`/` is true division, `//` floors, `%` takes the divisor's sign, `**` binds
//! tighter than a unary minus on its left), as the seed task's expressions mean them. A
//! recursive-descent parser over numbers, `+ - * / // % **` and parentheses; nothing the model
//! writes is ever run as code.

/// Longest expression accepted, in characters.
const MAX_CHARS: usize = 500;
/// Deepest nesting of parentheses and unary signs.
const MAX_DEPTH: usize = 64;
/// Largest integer exponent (larger powers of integers overflow anyway).
const MAX_EXPONENT: i128 = 4096;

/// A value: Python keeps integers exact and turns to floats on `/` or a float operand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    /// An exact integer.
    Int(i128),
    /// A float.
    Float(f64),
}

impl Num {
    fn float(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

impl std::fmt::Display for Num {
    /// As Python's `repr` writes it: `12`, `2.5`, `3.0`, `1e+16`, `1.5e-05`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Num::Int(i) => write!(f, "{i}"),
            Num::Float(x) => f.write_str(&python_float_repr(x)),
        }
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip (as Rust's), positional for
/// decimal exponents in [-4, 16), else scientific with a signed two-digit exponent.
fn python_float_repr(x: f64) -> String {
    if !x.is_finite() {
        return if x.is_nan() {
            "nan"
        } else if x > 0.0 {
            "inf"
        } else {
            "-inf"
        }
        .into();
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    if x != 0.0 && !(-4..16).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let s = format!("{x}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// Computes `expr`; the error says what is wrong with it (as the model will read it).
pub fn evaluate(expr: &str) -> Result<Num, String> {
    if expr.chars().count() > MAX_CHARS {
        return Err(format!(
            "the expression is longer than {MAX_CHARS} characters"
        ));
    }
    let tokens = lex(expr)?;
    if tokens.is_empty() {
        return Err("the expression is empty".into());
    }
    let mut p = Parser { tokens, at: 0 };
    let v = p.sum(0)?;
    match p.tokens.get(p.at) {
        None => Ok(v),
        Some(t) => Err(format!(
            "unexpected {} after a complete expression",
            t.shown()
        )),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tok {
    Num(Num),
    Plus,
    Minus,
    Star,
    Slash,
    SlashSlash,
    Percent,
    StarStar,
    Open,
    Close,
}

impl Tok {
    fn shown(&self) -> String {
        let s = match self {
            Tok::Num(n) => return format!("number {n}"),
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::Slash => "/",
            Tok::SlashSlash => "//",
            Tok::Percent => "%",
            Tok::StarStar => "**",
            Tok::Open => "(",
            Tok::Close => ")",
        };
        format!("`{s}`")
    }
}

fn lex(expr: &str) -> Result<Vec<Tok>, String> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let two = |n: u8| b.get(i + 1) == Some(&n);
        let (tok, len) = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'+' => (Tok::Plus, 1),
            b'-' => (Tok::Minus, 1),
            b'*' if two(b'*') => (Tok::StarStar, 2),
            b'*' => (Tok::Star, 1),
            b'/' if two(b'/') => (Tok::SlashSlash, 2),
            b'/' => (Tok::Slash, 1),
            b'%' => (Tok::Percent, 1),
            b'(' => (Tok::Open, 1),
            b')' => (Tok::Close, 1),
            b'0'..=b'9' | b'.' => number(&expr[i..])?,
            _ => {
                let ch = expr[i..].chars().next().unwrap_or('?');
                return Err(format!(
                    "`{ch}` is not allowed: use numbers, + - * / // % ** and parentheses"
                ));
            }
        };
        out.push(tok);
        i += len;
    }
    Ok(out)
}

/// The number at the start of `s` and its length in bytes.
fn number(s: &str) -> Result<(Tok, usize), String> {
    let b = s.as_bytes();
    let mut end = 0;
    let digits = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        j
    };
    end = digits(end);
    let mut float = false;
    if end < b.len() && b[end] == b'.' {
        float = true;
        end = digits(end + 1);
    }
    if end < b.len() && (b[end] == b'e' || b[end] == b'E') {
        let mut j = end + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        let k = digits(j);
        if k > j {
            float = true;
            end = k;
        }
    }
    let text = &s[..end];
    if text == "." {
        return Err("a lone `.` is not a number".into());
    }
    let n = if float {
        Num::Float(
            text.parse()
                .map_err(|_| format!("`{text}` is not a number"))?,
        )
    } else {
        Num::Int(text.parse().map_err(|_| format!("`{text}` is too large"))?)
    };
    Ok((Tok::Num(n), end))
}

struct Parser {
    tokens: Vec<Tok>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<Tok> {
        self.tokens.get(self.at).copied()
    }

    fn deeper(depth: usize) -> Result<usize, String> {
        if depth >= MAX_DEPTH {
            return Err(format!(
                "the expression nests deeper than {MAX_DEPTH} levels"
            ));
        }
        Ok(depth + 1)
    }

    /// sum := product (("+" | "-") product)*
    fn sum(&mut self, depth: usize) -> Result<Num, String> {
        let mut v = self.product(depth)?;
        while let Some(op @ (Tok::Plus | Tok::Minus)) = self.peek() {
            self.at += 1;
            let r = self.product(depth)?;
            v = binary(op, v, r)?;
        }
        Ok(v)
    }

    /// product := unary (("*" | "/" | "//" | "%") unary)*
    fn product(&mut self, depth: usize) -> Result<Num, String> {
        let mut v = self.unary(depth)?;
        while let Some(op @ (Tok::Star | Tok::Slash | Tok::SlashSlash | Tok::Percent)) = self.peek()
        {
            self.at += 1;
            let r = self.unary(depth)?;
            v = binary(op, v, r)?;
        }
        Ok(v)
    }

    /// unary := ("+" | "-") unary | power
    fn unary(&mut self, depth: usize) -> Result<Num, String> {
        match self.peek() {
            Some(Tok::Plus) => {
                self.at += 1;
                self.unary(Self::deeper(depth)?)
            }
            Some(Tok::Minus) => {
                self.at += 1;
                binary(Tok::Minus, Num::Int(0), self.unary(Self::deeper(depth)?)?)
            }
            _ => self.power(depth),
        }
    }

    /// power := atom ["**" unary] (right-associative; `-2 ** 2` is `-(2 ** 2)`)
    fn power(&mut self, depth: usize) -> Result<Num, String> {
        let base = self.atom(depth)?;
        if self.peek() == Some(Tok::StarStar) {
            self.at += 1;
            let exp = self.unary(Self::deeper(depth)?)?;
            return binary(Tok::StarStar, base, exp);
        }
        Ok(base)
    }

    /// atom := number | "(" sum ")"
    fn atom(&mut self, depth: usize) -> Result<Num, String> {
        let t = self.peek();
        self.at += 1;
        match t {
            Some(Tok::Num(n)) => Ok(n),
            Some(Tok::Open) => {
                let v = self.sum(Self::deeper(depth)?)?;
                match self.peek() {
                    Some(Tok::Close) => {
                        self.at += 1;
                        Ok(v)
                    }
                    Some(t) => Err(format!("expected `)` but found {}", t.shown())),
                    None => Err("a `(` is never closed".into()),
                }
            }
            Some(t) => Err(format!("expected a number or `(` but found {}", t.shown())),
            None => Err("the expression ends where a number was expected".into()),
        }
    }
}

fn overflow() -> String {
    "the result is too large".into()
}

/// Python's `a op b`.
fn binary(op: Tok, a: Num, b: Num) -> Result<Num, String> {
    let zero = || Err("division by zero".to_string());
    let v = match (a, b) {
        (Num::Int(x), Num::Int(y)) => match op {
            Tok::Plus => Num::Int(x.checked_add(y).ok_or_else(overflow)?),
            Tok::Minus => Num::Int(x.checked_sub(y).ok_or_else(overflow)?),
            Tok::Star => Num::Int(x.checked_mul(y).ok_or_else(overflow)?),
            Tok::Slash if y == 0 => return zero(),
            Tok::Slash => Num::Float(x as f64 / y as f64),
            Tok::SlashSlash | Tok::Percent if y == 0 => return zero(),
            Tok::SlashSlash => {
                Num::Int(x.div_euclid(y) - i128::from(y < 0 && x.rem_euclid(y) != 0))
            }
            Tok::Percent => {
                let r = x.rem_euclid(y);
                Num::Int(if y < 0 && r != 0 { r + y } else { r })
            }
            Tok::StarStar if y < 0 && x == 0 => return zero(),
            Tok::StarStar if y < 0 => Num::Float((x as f64).powf(y as f64)),
            Tok::StarStar if y > MAX_EXPONENT && x.abs() > 1 => return Err(overflow()),
            Tok::StarStar => {
                let e = u32::try_from(y).map_err(|_| overflow())?;
                Num::Int(x.checked_pow(e).ok_or_else(overflow)?)
            }
            _ => unreachable!("binary operators only"),
        },
        _ => {
            let (x, y) = (a.float(), b.float());
            let v = match op {
                Tok::Plus => x + y,
                Tok::Minus => x - y,
                Tok::Star => x * y,
                Tok::Slash | Tok::SlashSlash | Tok::Percent if y == 0.0 => return zero(),
                Tok::Slash => x / y,
                Tok::SlashSlash => float_divmod(x, y).0,
                Tok::Percent => float_divmod(x, y).1,
                Tok::StarStar if x == 0.0 && y < 0.0 => return zero(),
                Tok::StarStar => x.powf(y),
                _ => unreachable!("binary operators only"),
            };
            if !v.is_finite() {
                return Err(if v.is_nan() {
                    "the result is not a real number".into()
                } else {
                    overflow()
                });
            }
            Num::Float(v)
        }
    };
    Ok(v)
}

/// CPython's `float_divmod`: `(x // y, x % y)` for floats, `y != 0`.
fn float_divmod(x: f64, y: f64) -> (f64, f64) {
    let mut m = x % y; // C's fmod
    let mut div = (x - m) / y;
    if m != 0.0 {
        if (y < 0.0) != (m < 0.0) {
            m += y;
            div -= 1.0;
        }
    } else {
        m = 0f64.copysign(y);
    }
    let floordiv = if div != 0.0 {
        let f = div.floor();
        if div - f > 0.5 {
            f + 1.0
        } else {
            f
        }
    } else {
        0f64.copysign(x / y)
    };
    (floordiv, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(e: &str) -> String {
        match evaluate(e) {
            Ok(v) => v.to_string(),
            Err(m) => format!("error: {m}"),
        }
    }

    /// Each case's value is what `python3 -c "print(repr(EXPR))"` prints.
    #[test]
    fn python_semantics() {
        for (e, want) in [
            ("17 * (18 - 14)", "68"),
            ("2 + 3 * 4", "14"),
            ("(2 + 3) * 4", "20"),
            ("7 / 2", "3.5"),
            ("8 / 2", "4.0"),
            ("7 // 2", "3"),
            ("-7 // 2", "-4"),
            ("7 // -2", "-4"),
            ("-7 % 3", "2"),
            ("7 % -3", "-2"),
            ("2 ** 10", "1024"),
            ("-2 ** 2", "-4"),
            ("2 ** -1", "0.5"),
            ("2 ** 3 ** 2", "512"),
            ("--3", "3"),
            ("1.5 * 4", "6.0"),
            ("7.5 // 2", "3.0"),
            ("-7.5 % 2", "0.5"),
            ("1e3 + 1", "1001.0"),
            ("((((1))))", "1"),
            (" 10 - 4 - 3 ", "3"),
        ] {
            assert_eq!(show(e), want, "{e}");
        }
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for (e, part) in [
            ("1 / 0", "division by zero"),
            ("5 // 0", "division by zero"),
            ("5 % 0.0", "division by zero"),
            ("", "empty"),
            ("2 +", "ends where a number"),
            ("(1 + 2", "never closed"),
            ("1 + 2)", "unexpected `)`"),
            ("__import__('os')", "not allowed"),
            ("x + 1", "not allowed"),
            ("10 ** 100", "too large"),
            ("9 ** 99999", "too large"),
            ("1 2", "unexpected number 2"),
            (".", "not a number"),
            ("(-8) ** 0.5", "not a real number"),
        ] {
            let got = show(e);
            assert!(
                got.starts_with("error:") && got.contains(part),
                "{e}: {got}"
            );
        }
        let deep = format!("{}1{}", "(".repeat(100), ")".repeat(100));
        assert!(show(&deep).contains("nests deeper"));
        assert!(show(&"1+".repeat(300)).contains("longer than"));
    }
}
