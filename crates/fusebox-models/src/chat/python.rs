//! The Python behaviour chat templates see under `transformers`: `tojson` is
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`
//! (not Jinja's HTML-safe filter), and `{{ x }}` prints `None`, `True`, `False`, floats
//! and containers as Python's `str()` does.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind, Output, State};

/// The `tojson` filter as transformers defines it.
///
/// `x | tojson(indent=None, ensure_ascii=False, separators=None, sort_keys=False)`;
/// `indent` may also be the first positional argument, as in Jinja.
pub(crate) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.kind() {
            ValueKind::Number => Some(" ".repeat(usize::try_from(v.clone()).map_err(|_| {
                Error::new(ErrorKind::InvalidOperation, format!("tojson: indent must be ≥ 0, got {v}"))
            })?)),
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
            _ => return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: indent {v} is not a number"))),
        },
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> = v.try_iter()?.map(|p| p.to_string()).collect();
            match parts.as_slice() {
                [item, key] => Some((item.clone(), key.clone())),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: separators must be two strings, got {v}"),
                    ))
                }
            }
        }
        _ => None,
    };
    kwargs.assert_all_used()?;
    // Python: (', ', ': ') without indent, (',', ': ') with it.
    let (item_sep, key_sep) =
        separators.unwrap_or_else(|| (if indent.is_some() { "," } else { ", " }.to_owned(), ": ".to_owned()));
    let dumper = Dumper { indent: indent.as_deref(), item_sep: &item_sep, key_sep: &key_sep, ensure_ascii, sort_keys };
    let mut out = String::new();
    dumper.dump(value, 0, &mut out)?;
    Ok(out)
}

struct Dumper<'a> {
    indent: Option<&'a str>,
    item_sep: &'a str,
    key_sep: &'a str,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl Dumper<'_> {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(ind) = self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn dump(&self, v: &Value, level: usize, out: &mut String) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Undefined => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: an undefined value is not JSON serializable",
                ))
            }
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&json_number(v)),
            ValueKind::String => json_string(&v.to_string(), self.ensure_ascii, out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.dump(item, level + 1, out)?;
                }
                self.newline(level, out);
                out.push(']');
            }
            ValueKind::Map => {
                let mut entries: Vec<(String, Value)> = Vec::new();
                for key in v.try_iter()? {
                    let item = v.get_item(&key)?;
                    let key = match key.kind() {
                        ValueKind::String => key.to_string(),
                        ValueKind::None => "null".to_owned(),
                        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
                        ValueKind::Number => json_number(&key),
                        _ => {
                            return Err(Error::new(
                                ErrorKind::InvalidOperation,
                                format!("tojson: keys must be str, int, float, bool or None, not {key}"),
                            ))
                        }
                    };
                    entries.push((key, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if entries.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, (key, item)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(level + 1, out);
                    json_string(key, self.ensure_ascii, out);
                    out.push_str(self.key_sep);
                    self.dump(item, level + 1, out)?;
                }
                self.newline(level, out);
                out.push('}');
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a value of kind {} is not JSON serializable", v.kind()),
                ))
            }
        }
        Ok(())
    }
}

/// A number as `json.dumps` writes it: integers in full, floats as `float.__repr__`,
/// and `NaN`, `Infinity`, `-Infinity`.
fn json_number(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    match f64::try_from(v.clone()) {
        Ok(f) if f.is_nan() => "NaN".to_owned(),
        Ok(f) if f.is_infinite() => (if f > 0.0 { "Infinity" } else { "-Infinity" }).to_owned(),
        Ok(f) => python_float(f),
        Err(_) => v.to_string(),
    }
}

/// `repr(f)` for a finite float: the shortest digits that round-trip, in fixed notation
/// for decimal exponents -4..16 (with at least one decimal), else `d.ddde±XX`.
pub(crate) fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_owned();
    }
    if f.is_infinite() {
        return (if f > 0.0 { "inf" } else { "-inf" }).to_owned();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7", "1e20".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let mut s = String::from(sign);
        if point <= 0 {
            s.push_str("0.");
            s.extend(std::iter::repeat_n('0', (-point) as usize));
            s.push_str(&digits);
        } else if point as usize >= digits.len() {
            s.push_str(&digits);
            s.extend(std::iter::repeat_n('0', point as usize - digits.len()));
            s.push_str(".0");
        } else {
            s.push_str(&digits[..point as usize]);
            s.push('.');
            s.push_str(&digits[point as usize..]);
        }
        s
    } else {
        let mut s = format!("{sign}{}", &digits[..1]);
        if digits.len() > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        let _ = write!(s, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
        s
    }
}

/// A JSON string literal as Python writes it (`\uXXXX` for other controls, and for
/// everything past ASCII when `ensure_ascii`, as UTF-16 surrogate pairs).
fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
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
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr` of a string: single quotes unless the text has `'` and no `"`.
fn python_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
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
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `str(v)` in Python: what `{{ v }}` prints under Jinja2.
fn python_str(v: &Value, nested: bool, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number if !v.is_integer() => match f64::try_from(v.clone()) {
            Ok(f) => out.push_str(&python_float(f)),
            Err(_) => {
                let _ = write!(out, "{v}");
            }
        },
        ValueKind::String if nested => python_repr_str(&v.to_string(), out),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_str(&item, true, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_str(&key, true, out)?;
                out.push_str(": ");
                python_str(&v.get_item(&key)?, true, out)?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{v}");
        }
    }
    Ok(())
}

/// The formatter of `{{ … }}`: Python's `str()` (no auto-escaping, as transformers'
/// environment has none).
pub(crate) fn format(out: &mut Output, _state: &mut State, value: &Value) -> Result<(), Error> {
    let mut s = String::new();
    python_str(value, false, &mut s)?;
    out.write_str(&s)
        .map_err(|e| Error::new(ErrorKind::WriteFailure, "cannot write the template output").with_source(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (1e22, "1e+22"),
            (-0.0, "-0.0"),
        ] {
            assert_eq!(python_float(f), want, "{f}");
        }
    }

    #[test]
    fn strings_escape_as_python_json() {
        let mut s = String::new();
        json_string("a\"b\\c\nd\u{1}é🦀", false, &mut s);
        assert_eq!(s, "\"a\\\"b\\\\c\\nd\\u0001é🦀\"");
        s.clear();
        json_string("é🦀", true, &mut s);
        assert_eq!(s, "\"\\u00e9\\ud83e\\udd80\"");
    }
}
