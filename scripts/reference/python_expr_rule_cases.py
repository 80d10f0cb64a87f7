#!/usr/bin/env python3
"""Golden cases for the `python_expr_rule` reward (the seed example's format + accuracy rule).

Writes two files, which `crates/rlft-rewards/tests/python_expr_rule.rs` replays against the Rust
implementation:
- `tests/fixtures/tiny_python_expr/reward_cases.jsonl`: the seed example's 25 hand-picked cases
  (`FIXTURE_CASES`), one `{"completion", "ground_truth", "format", "accuracy", "total"}` object per
  line (reproduced byte for byte);
- `crates/rlft-rewards/tests/data/python_expr_rule_extra.jsonl`: the extra cases below.

The rule, as the seed example's specification ("The seed example", "Reward") states it:

- response: strip; if `<|im_start|>assistant` occurs, keep what follows its last occurrence, up to
  the first `<|im_end|>` after it, stripped;
- boxed = first match of `\\boxed\{([^{}]*)\}`, stripped; format = 1 if boxed is non-empty;
- prediction = boxed if non-empty, else the last match of `-?\d+(?:\.\d+)?` after removing commas;
- normalise: strip, strip `$`, drop `,`, strip trailing `.`, parse as `decimal.Decimal`; integral ->
  `str(int(v))`, else fixed notation without trailing zeros; unparsable -> as is;
- accuracy = 1 if the prediction is non-empty and equals the normalised ground truth;
- total = 0.1 * format + 0.9 * accuracy.

Where the literal rule raises instead of returning (Infinity: `int()` overflows; sNaN: `normalize()`
signals InvalidOperation; |v| >= 10**1000000: Overflow; integers over 4300 digits: the int->str
limit of Python >= 3.11), rlft keeps the text as is, like an unparsable value, and so does
`normalize` below. Those cases carry `"python_raises": "<exception name>"`.

Plain Python 3.11 (the stdlib only): its Unicode 14 digit table and 4300-digit limit are what the
Rust side pins. Run from the repository root:

    python3 scripts/reference/python_expr_rule_cases.py

Line kinds in the extra cases' file (the first line is `{"_meta": {...}}`):
- reward cases: completion, ground_truth, format, accuracy, total, prediction,
  prediction_normalized, ground_truth_normalized, python_raises;
- normalisation cases: normalize, expected, python_raises.
Normalised strings longer than 300 characters are stored as `<field>_len`, `<field>_head`,
`<field>_tail` (first and last 20 characters) to keep the file small.
"""

import json
import os
import random
import re
import sys
import unicodedata
from decimal import Decimal, InvalidOperation

ASSISTANT = "<|im_start|>assistant"
END = "<|im_end|>"
BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
MAX_STORED = 300


def response_text(text):
    text = text.strip()
    at = text.rfind(ASSISTANT)
    if at < 0:
        return text
    turn = text[at + len(ASSISTANT):]
    end = turn.find(END)
    if end >= 0:
        turn = turn[:end]
    return turn.strip()


def boxed_answer(text):
    m = BOXED_RE.search(text)
    return m.group(1).strip() if m else ""


def candidate(text):
    b = boxed_answer(text)
    if b:
        return b
    found = NUMBER_RE.findall(text.replace(",", ""))
    return found[-1] if found else ""


def normalize(text):
    """Returns (normalised text, name of the exception the literal rule raises or None)."""
    raw = text.strip().strip("$").replace(",", "").rstrip(".")
    if not raw:
        return "", None
    try:
        value = Decimal(raw)
    except InvalidOperation:
        return raw, None
    try:
        value = value.normalize()
        if value == value.to_integral():
            return str(int(value)), None
        return format(value, "f").rstrip("0").rstrip("."), None
    except (ArithmeticError, ValueError) as e:
        return raw, type(e).__name__


def put(out, key, value):
    if len(value) <= MAX_STORED:
        out[key] = value
    else:
        out[key + "_len"] = len(value)
        out[key + "_head"] = value[:20]
        out[key + "_tail"] = value[-20:]


def reward_case(completion, ground_truth):
    response = response_text(completion)
    fmt = 1.0 if boxed_answer(response) else 0.0
    pred_raw = candidate(response)
    pred, raised_p = normalize(pred_raw)
    truth, raised_t = normalize(ground_truth)
    acc = 1.0 if pred and pred == truth else 0.0
    out = {
        "completion": completion,
        "ground_truth": ground_truth,
        "format": fmt,
        "accuracy": acc,
        "total": 0.1 * fmt + 0.9 * acc,
        "prediction": pred_raw,
    }
    put(out, "prediction_normalized", pred)
    put(out, "ground_truth_normalized", truth)
    out["python_raises"] = raised_p or raised_t
    return out


def normalize_case(text):
    value, raised = normalize(text)
    out = {"normalize": text}
    put(out, "expected", value)
    out["python_raises"] = raised
    return out


SYSTEM = (
    "<|im_start|>system\nYou are a careful arithmetic assistant. Return the final result in the "
    "format \\boxed{answer}.<|im_end|>\n<|im_start|>user\nExpression: (13 * 2)\nReturn only the "
    "final result in the format \\boxed{answer}.<|im_end|>\n"
)
# The seed example's whole prompt (its system prompt and user turn) up to the assistant's reply.
FULL_PROMPT = (
    "<|im_start|>system\nYou are a careful arithmetic assistant. Solve the expression and respond "
    "briefly. Return the final result in the format \\boxed{answer}. Do not add unnecessary "
    "explanation.<|im_end|>\n<|im_start|>user\nCompute this Python-style arithmetic expression.\n"
    "Expression: (13 * 2)\nReturn only the final result in the format \\boxed{answer}.<|im_end|>\n"
    "<|im_start|>assistant\n"
)

# The seed fixture: completions and ground truths (format, accuracy and total are computed).
FIXTURE_CASES = [
    ("\\boxed{26}", "26"),
    ("The answer is \\boxed{26}.", "26"),
    ("\\boxed{27}", "26"),
    ("26", "26"),
    ("It is 25, no wait, 26", "26"),
    ("\\boxed{}", "26"),
    ("\\boxed{ }", "26"),
    ("\\boxed{26.0}", "26"),
    ("\\boxed{\\text{26}}", "26"),
    ("\\boxed{1,000}", "1000"),
    ("$\\boxed{26}$", "26"),
    ("\\boxed{$26$}", "26"),
    ("\\boxed{026}", "26"),
    ("\\boxed{26.}", "26"),
    ("no number here", "26"),
    ("", "0"),
    (FULL_PROMPT + "\\boxed{26}<|im_end|>", "26"),
    (FULL_PROMPT + "26<|im_end|>", "26"),
    (FULL_PROMPT + "I don't know<|im_end|>", "26"),
    ("\\boxed{2.50}", "2.5"),
    ("\\boxed{-3}", "-3"),
    ("\\boxed{26} then \\boxed{27}", "27"),
    ("\\boxed{abc}", "abc"),
    ("  \\boxed{ 26 }  ", "26"),
    ("3.14 and 26.000", "26"),
]

REWARD_CASES = [
    ("\\boxed{26}", "26"),
    ("\\boxed{26.000}", "26"),
    ("\\boxed{1e2}", "100"),
    ("\\boxed{1E+2}", "100"),
    ("\\boxed{0.50}", "0.5"),
    ("\\boxed{.5}", "0.5"),
    ("\\boxed{-0}", "0"),
    ("\\boxed{-0.0}", "0"),
    ("\\boxed{+26}", "26"),
    ("\\boxed{1_000}", "1000"),
    ("\\boxed{1,000,000}", "1000000"),
    ("\\boxed{$1,000$}", "1000"),
    ("\\boxed{$$26$$}", "26"),
    ("\\boxed{26...}", "26"),
    ("\\boxed{ 26 . }", "26"),
    ("\\boxed{2 6}", "26"),
    ("\\boxed{26}", "26.0"),
    ("\\boxed{26}", " $26.$ "),
    ("\\boxed{26}", "2.6e1"),
    ("\\boxed{Infinity}", "Infinity"),
    ("\\boxed{inf}", "26"),
    ("\\boxed{NaN}", "NaN"),
    ("\\boxed{nan}", "NaN"),
    ("\\boxed{-nan}", "NaN"),
    ("\\boxed{sNaN}", "sNaN"),
    ("\\boxed{1e999999}", "1"),
    ("\\boxed{1e1000000}", "1e1000000"),
    ("\\boxed{1e4299}", "1e4299"),
    ("\\boxed{1e4300}", "1e4300"),
    ("\\boxed{12345678901234567890123456789}", "12345678901234567890123456790"),
    ("\\boxed{12345678901234567890123456785}", "12345678901234567890123456780"),
    ("\\boxed{0.1000000000000000000000000000001}", "0.1"),
    ("\\boxed{1e-7}", "0.0000001"),
    ("\\boxed{0x1A}", "26"),
    ("\\boxed{\u0662\u0666}", "26"),
    ("\\boxed{\uff12\uff16}", "26"),
    ("\\boxed{26}\\boxed{27}", "26"),
    ("\\boxed{}\\boxed{26}", "26"),
    ("\\boxed{ }\\boxed{26}", "26"),
    ("\\boxed{\\frac{1}{2}}", "2"),
    ("\\boxed{\\frac{1}{2}} so 0.5", "0.5"),
    ("\\boxed{{26}}", "26"),
    ("\\boxed{a{b}c} 26", "26"),
    ("\\boxed {26}", "26"),
    ("\\boxed{26", "26"),
    ("\\Boxed{26}", "26"),
    ("\\boxed{\n26\n}", "26"),
    ("boxed{26}", "26"),
    ("\\\\boxed{26}", "26"),
    ("The answer is 1,234.50 dollars", "1234.5"),
    ("-26", "-26"),
    ("- 26", "-26"),
    ("--26", "-26"),
    ("x-26y", "-26"),
    ("26-27", "-27"),
    ("3.14.15", "15"),
    ("1.5e3", "3"),
    ("1,2,3", "123"),
    ("7.", "7"),
    ("answer: .5", "5"),
    ("\u0663 and \u0664", "4"),
    ("\u00b2", "2"),
    ("\u2167", "8"),
    ("\U0001d7d0", "2"),
    ("", ""),
    ("   ", "0"),
    ("no digits", "no digits"),
    ("\\boxed{abc}", "abc"),
    ("\\boxed{abc}", " abc "),
    ("\\boxed{ABC}", "abc"),
    (SYSTEM + "<|im_start|>assistant\n\\boxed{26}<|im_end|>", "26"),
    (SYSTEM + "<|im_start|>assistant\n26<|im_end|>", "26"),
    (SYSTEM + "<|im_start|>assistant\n\\boxed{26}", "26"),
    (SYSTEM + "<|im_start|>assistant\n\\boxed{26}<|im_end|>\n\\boxed{27}", "27"),
    (SYSTEM + "<|im_start|>assistant\n\\boxed{1}<|im_end|>\n<|im_start|>assistant\n\\boxed{26}<|im_end|>", "26"),
    ("<|im_start|>assistant", "0"),
    ("<|im_start|>assistant<|im_end|>\\boxed{26}", "26"),
    ("\\boxed{26}<|im_end|>", "26"),
    ("<|im_start|>assistan\\boxed{26}", "26"),
    ("<|im_start|>Assistant\n\\boxed{26}", "26"),
    ("\\boxed{26}", "\\boxed{26}"),
    ("\u3000\\boxed{\u200026\u2000}\u3000", "26"),
    ("\x1c\\boxed{26}\x1f", "26"),
    ("\\boxed{26\x00}", "26"),
    ("\\boxed{1.23e-1000000}", "0"),
    ("\\boxed{5e-1000027}", "0"),
    ("\\boxed{0e99999999}", "0"),
    ("\\boxed{0e1000000000000000000}", "0"),
    ("\\boxed{1e-1999999999999999997}", "0"),
    ("\\boxed{1e-1999999999999999998}", "0"),
    ("\\boxed{" + "9" * 30 + "e999969}", "1"),
    ("\\boxed{" + "9" * 30 + "e999970}", "1"),
]

NORMALIZE_CASES = [
    "26", "26.0", "26.000", "026", "-0", "+0", "-0.0", "0e5", "0.000", "00", "-00.00e-0",
    "1e2", "1E2", "1e+2", "1e-2", "1e-0", "1e05", "1.e5", ".5", "+.5", "-.5e1", "0.1e1", "123.456e1",
    "1.5e-3", "1.234e-7", "-1.234e-7", "2.50", "-2.50", "1.", "1..", "1.2.3", "--1", "+-1", "-", "+",
    ".", "..", "", " ", "$", "$$", "$ $", ",", "$,.$", "e5", ".e5", "1e", "1e+", "1e+-2", "1e5.0",
    "1e_", "1_000", "1__000", "_1", "1_", "_", "__", "1_.5", "1._5", "1e1_0", "1_0.0_1e1_0", "_ 1",
    "1 _", " _1", "In_f", "N_aN", "0x10", "1 2", "1\x00", "\x001", "Infinity", "infinity", "-inf",
    "inF", "+Inf", "infinit", "infinity1", "infinityy", "nan", "NaN", "-nan", "+nan", " nan ",
    "nan0", "nan00", "NaN00120", "NaN123", "-nan5", "nan.5", "NaN-1", "NaNe1", "nan" + "1" * 30,
    "nan" + "1" * 40, "nan" + "9" * 27 + "0", "sNaN", "snan", "-snan", "sNaN5", "$26$", "26,000",
    "26.", "26. .", " $ 26 $ ", "$\x1c1$", "$1\u2000$", "$\u20001$", "$1\u20002$",
    "\u0663\u0662", "\u0663e\u0662", "\u0661\u0662\u066b\u0665", "\uff11\uff12", "\uff45",
    "\u00b2", "1e999999", "1e1000000", "1e-999999", "1e-1000000", "1e-1000026", "1.5e-1000026",
    "2.5e-1000026", "2.51e-1000026", "5e-1000027", "6e-1000027", "5.0000001e-1000027",
    "1.23456789012345678901234567890123e-999999", "1.23456789012345678901234567890123e-1000000",
    "9" * 30 + "e-1000029", "9" * 30 + "e999970", "9" * 30 + "e999969", "0e99999999",
    "0e999999999999999999", "0e1000000000000000000", "0.0e1000000000000000000",
    "0e-1999999999999999997", "0e-1999999999999999998", "1e-1999999999999999997",
    "1e-1999999999999999998", "10e-1999999999999999998", "1.0e-1999999999999999996",
    "1e999999999999999999", "1e9223372036854775808", "0e9223372036854775808",
    "0e-9223372036854775809", "1e99999999999999999999", "1e-99999999999999999999",
    "1" + "0" * 4299, "1" + "0" * 4300, "1e4299", "1e4300", "-1e4299", "-1e4300",
    "12345678901234567890123456789", "12345678901234567890123456785",
    "12345678901234567890123456795", "99999999999999999999999999995",
    "99999999999999999999999999985", "0.99999999999999999999999999999",
    "0.1000000000000000000000000000001", "0.000000000000000000000000000025",
    "0.000000000000000000000000000012345678901234567890123456789",
    "1e-0000000000000000000000000000000000000000003", "1" + "0" * 40 + "e-40",
]

TOKENS = [
    "\\boxed{", "\\boxed{", "}", "{", "$", ",", ".", ".", "-", "+", "e", "E", "_", "0", "1", "2",
    "5", "9", "26", "00", " ", " ", "\n", "\t", "x", "nan", "inf", "\u0663", "\u2000", "\uff12",
    "<|im_start|>assistant", "<|im_end|>", "\\frac{1}{2}", "Infinity", "1e4", "sNaN",
]
TRUTHS = ["26", "0", "-3", "2.5", "1000", "abc", "26.0", "", "0.5", "-0", "1e2", "NaN"]


def random_cases(n, seed):
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        k = rng.randint(0, 12)
        completion = "".join(rng.choice(TOKENS) for _ in range(k))
        cases.append((completion, rng.choice(TRUTHS)))
    return cases


def unicode_cases():
    """One case per Unicode decimal-digit block: Python's `\\d` and Decimal accept all of them."""
    out = []
    for cp in range(0x110000):
        ch = chr(cp)
        if ch.isdecimal() and unicodedata.decimal(ch) == 0:
            four, two = chr(cp + 4), chr(cp + 2)
            out.append(reward_case("so " + four + two + " it is", "42"))
            out.append(normalize_case(four + "." + two + "0"))
    for cp in range(0x110000):
        ch = chr(cp)
        if ch.isspace():
            out.append(reward_case(ch + "\\boxed{" + ch + "26" + ch + "}" + ch, "26"))
            out.append(normalize_case("$" + ch + "7" + ch + "$"))
            out.append(normalize_case("7" + ch + "7"))
    return out


def main():
    if sys.version_info[:2] != (3, 11):
        print("warning: the committed file was made with Python 3.11 (Unicode 14.0)", file=sys.stderr)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    fixture = os.path.join(root, "tests", "fixtures", "tiny_python_expr", "reward_cases.jsonl")
    keys = ["completion", "ground_truth", "format", "accuracy", "total"]
    with open(fixture, "w", encoding="utf-8") as f:
        for c, t in FIXTURE_CASES:
            case = reward_case(c, t)
            f.write(json.dumps({k: case[k] for k in keys}) + "\n")
    print(f"wrote {len(FIXTURE_CASES)} cases to {fixture}")
    path = os.path.join(root, "crates", "rlft-rewards", "tests", "data", "python_expr_rule_extra.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lines = [{"_meta": {
        "python": sys.version.split()[0],
        "unicode": unicodedata.unidata_version,
        "int_max_str_digits": sys.int_info.default_max_str_digits,
        "script": "scripts/reference/python_expr_rule_cases.py",
    }}]
    lines += [reward_case(c, t) for c, t in REWARD_CASES]
    lines += [normalize_case(t) for t in NORMALIZE_CASES]
    lines += [reward_case(c, t) for c, t in random_cases(600, seed=20240601)]
    lines += unicode_cases()
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=True) + "\n")
    raised = sum(1 for line in lines if line.get("python_raises"))
    print(f"wrote {len(lines) - 1} cases ({raised} where the literal rule raises) to {path}")


if __name__ == "__main__":
    main()
