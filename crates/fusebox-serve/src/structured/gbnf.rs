//! llama.cpp's GBNF grammars, rewritten as the Lark grammars llguidance compiles.
//!
//! GBNF: `name ::= alternatives`, one rule per line (a rule goes on over a newline
//! only inside parentheses or after `|`), `root` the start; terms are `"literals"`
//! (escapes `\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH`), character classes
//! `[a-z]` / `[^"\\]`, `.` (any character), rule names, `( groups )`, each followed by
//! any of `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}`; `#` starts a comment.
//!
//! Lark out: `start: root`, each rule on one line under a lowercase name (GBNF names
//! may hold capitals, Lark rules may not; clashes get a numeric suffix), literals as
//! JSON strings, classes and `.` as regular expressions whose characters are written
//! `\x{HEX}` so that nothing in them needs escaping.

use std::collections::HashMap;
use std::fmt::Write as _;

/// A GBNF term.
#[derive(Debug, Clone, PartialEq)]
enum Term {
    Literal(String),
    /// Ranges (inclusive), negated when the flag is set.
    Class(Vec<(char, char)>, bool),
    Any,
    Rule(String),
    Group(Vec<Vec<Term>>),
    /// A term repeated `min ..= max` times (`None`: unbounded).
    Repeat(Box<Term>, u32, Option<u32>),
}

/// Whether `text` reads as GBNF (some line defines a rule with `::=`) rather than Lark.
pub fn looks_like_gbnf(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start();
        let name_end = l.find(|c: char| !is_name_char(c)).unwrap_or(l.len());
        name_end > 0 && l[name_end..].trim_start().starts_with("::=")
    })
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn rest(&self) -> &'a str {
        &self.src[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// 1-based line and column of the position, for errors.
    fn at(&self) -> String {
        let before = &self.src[..self.pos];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!("line {line}, column {col}")
    }

    fn err(&self, what: impl std::fmt::Display) -> String {
        format!("GBNF grammar, {}: {what}", self.at())
    }

    /// Skips spaces and comments, and newlines when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => {
                    self.bump();
                }
                '\r' | '\n' if newlines => {
                    self.bump();
                }
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.bump();
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let n = self.rest().find(|c: char| !is_name_char(c)).unwrap_or(self.rest().len());
        if n == 0 {
            return None;
        }
        let name = self.rest()[..n].to_string();
        self.pos += n;
        Some(name)
    }

    fn number(&mut self) -> Option<u32> {
        let n = self.rest().find(|c: char| !c.is_ascii_digit()).unwrap_or(self.rest().len());
        let v = self.rest()[..n].parse().ok()?;
        self.pos += n;
        Some(v)
    }

    fn hex(&mut self, digits: usize) -> Result<char, String> {
        let s = self.rest().get(..digits).ok_or_else(|| self.err("a hex escape is cut short"))?;
        let v = u32::from_str_radix(s, 16).map_err(|_| self.err(format!("bad hex escape '{s}'")))?;
        self.pos += digits;
        char::from_u32(v).ok_or_else(|| self.err(format!("escape {v:#x} is not a character")))
    }

    /// One character of a literal or a class, escapes read.
    fn char(&mut self) -> Result<char, String> {
        match self.bump() {
            None => Err(self.err("unexpected end of the grammar")),
            Some('\\') => match self.bump() {
                Some('x') => self.hex(2),
                Some('u') => self.hex(4),
                Some('U') => self.hex(8),
                Some('n') => Ok('\n'),
                Some('r') => Ok('\r'),
                Some('t') => Ok('\t'),
                Some(c @ ('\\' | '"' | '[' | ']' | '-' | '^')) => Ok(c),
                Some(c) => Err(self.err(format!("unknown escape '\\{c}'"))),
                None => Err(self.err("unexpected end of the grammar")),
            },
            Some(c) => Ok(c),
        }
    }

    fn alternatives(&mut self, nested: bool) -> Result<Vec<Vec<Term>>, String> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.bump();
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Term>, String> {
        let mut seq = Vec::new();
        loop {
            let term = match self.peek() {
                Some('"') => {
                    self.bump();
                    let mut s = String::new();
                    while self.peek() != Some('"') {
                        if self.peek().is_none() {
                            return Err(self.err("a literal is not closed with '\"'"));
                        }
                        s.push(self.char()?);
                    }
                    self.bump();
                    Term::Literal(s)
                }
                Some('[') => {
                    self.bump();
                    let negated = self.peek() == Some('^');
                    if negated {
                        self.bump();
                    }
                    let mut ranges = Vec::new();
                    while self.peek() != Some(']') {
                        if self.peek().is_none() {
                            return Err(self.err("a character class is not closed with ']'"));
                        }
                        let lo = self.char()?;
                        let hi = if self.peek() == Some('-') && !self.rest().starts_with("-]") {
                            self.bump();
                            self.char()?
                        } else {
                            lo
                        };
                        if hi < lo {
                            return Err(self.err(format!("the range '{lo}-{hi}' runs backwards")));
                        }
                        ranges.push((lo, hi));
                    }
                    self.bump();
                    Term::Class(ranges, negated)
                }
                Some('.') => {
                    self.bump();
                    Term::Any
                }
                Some('(') => {
                    self.bump();
                    self.space(true);
                    let alts = self.alternatives(true)?;
                    if self.bump() != Some(')') {
                        return Err(self.err("expected ')'"));
                    }
                    Term::Group(alts)
                }
                Some(c) if is_name_char(c) => {
                    let save = self.pos;
                    let name = self.name().unwrap_or_default();
                    // `name ::=` starts the next rule: this sequence ended at the newline.
                    let mut look = Parser { src: self.src, pos: self.pos };
                    look.space(false);
                    if look.rest().starts_with("::=") {
                        self.pos = save;
                        return Err(self.err(format!("rule '{name}' starts in the middle of another")));
                    }
                    Term::Rule(name)
                }
                _ => break,
            };
            let term = self.repetitions(term)?;
            seq.push(term);
            self.space(nested);
        }
        Ok(seq)
    }

    fn repetitions(&mut self, mut term: Term) -> Result<Term, String> {
        loop {
            term = match self.peek() {
                Some('*') => Term::Repeat(Box::new(term), 0, None),
                Some('+') => Term::Repeat(Box::new(term), 1, None),
                Some('?') => Term::Repeat(Box::new(term), 0, Some(1)),
                Some('{') => {
                    self.bump();
                    self.space(false);
                    let min = self.number();
                    self.space(false);
                    let max = if self.peek() == Some(',') {
                        self.bump();
                        self.space(false);
                        self.number()
                    } else {
                        Some(min.ok_or_else(|| self.err("expected a count after '{'"))?)
                    };
                    self.space(false);
                    if self.peek() != Some('}') {
                        return Err(self.err("expected '}' to close a repetition"));
                    }
                    let min = min.unwrap_or(0);
                    if max.is_some_and(|m| m < min) {
                        return Err(self.err(format!(
                            "repetition {{{min},{}}} has its maximum below its minimum",
                            max.unwrap_or(0)
                        )));
                    }
                    Term::Repeat(Box::new(term), min, max)
                }
                _ => return Ok(term),
            };
            self.bump();
        }
    }
}

/// A rule: its name and its alternatives.
type Rule = (String, Vec<Vec<Term>>);

/// Parses GBNF text into its rules, in order.
fn parse(src: &str) -> Result<Vec<Rule>, String> {
    let mut p = Parser { src, pos: 0 };
    let mut rules = Vec::new();
    loop {
        p.space(true);
        if p.peek().is_none() {
            break;
        }
        let name = p.name().ok_or_else(|| p.err("expected a rule name"))?;
        p.space(false);
        if !p.rest().starts_with("::=") {
            return Err(p.err(format!("expected '::=' after '{name}'")));
        }
        p.pos += 3;
        p.space(true);
        let alts = p.alternatives(false)?;
        match p.peek() {
            None | Some('\n' | '\r') => {}
            Some(c) => return Err(p.err(format!("unexpected '{c}'"))),
        }
        rules.push((name, alts));
    }
    Ok(rules)
}

fn regex_char(out: &mut String, c: char) {
    let _ = write!(out, "\\x{{{:x}}}", c as u32);
}

/// A Lark string literal: JSON's syntax, with DEL escaped too (Lark refuses it raw).
fn lark_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default().replace('\u{7f}', "\\u007f")
}

fn emit_term(out: &mut String, t: &Term, names: &HashMap<&str, String>) -> Result<(), String> {
    match t {
        Term::Literal(s) => out.push_str(&lark_string(s)),
        Term::Class(ranges, negated) => {
            out.push_str(if *negated { "/[^" } else { "/[" });
            for &(lo, hi) in ranges {
                regex_char(out, lo);
                if hi != lo {
                    out.push('-');
                    regex_char(out, hi);
                }
            }
            out.push_str("]/");
        }
        Term::Any => out.push_str("/(?s:.)/"),
        Term::Rule(n) => {
            let name =
                names.get(n.as_str()).ok_or_else(|| format!("GBNF grammar: rule '{n}' is used but not defined"))?;
            out.push_str(name);
        }
        Term::Group(alts) => {
            out.push('(');
            emit_alternatives(out, alts, names)?;
            out.push(')');
        }
        // Zero times: nothing (Lark refuses `{0}`).
        Term::Repeat(_, _, Some(0)) => out.push_str("\"\""),
        Term::Repeat(inner, min, max) => {
            // Lark takes one operator per atom: a repeated repetition is grouped.
            let group = matches!(**inner, Term::Repeat(..));
            out.push_str(if group { "(" } else { "" });
            emit_term(out, inner, names)?;
            out.push_str(if group { ")" } else { "" });
            match (min, max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => {
                    let _ = write!(out, "{{{m},}}");
                }
                (m, Some(n)) => {
                    let _ = write!(out, "{{{m},{n}}}");
                }
            }
        }
    }
    Ok(())
}

fn emit_alternatives(out: &mut String, alts: &[Vec<Term>], names: &HashMap<&str, String>) -> Result<(), String> {
    for (i, seq) in alts.iter().enumerate() {
        if i > 0 {
            out.push_str(" | ");
        }
        if seq.is_empty() {
            out.push_str("\"\"");
        }
        for (j, t) in seq.iter().enumerate() {
            if j > 0 {
                out.push(' ');
            }
            emit_term(out, t, names)?;
        }
    }
    Ok(())
}

/// The Lark grammar equivalent to GBNF `src`, or what is wrong with `src`.
pub fn to_lark(src: &str) -> Result<String, String> {
    let rules = parse(src)?;
    let mut names: HashMap<&str, String> = HashMap::new();
    let mut taken: std::collections::HashSet<String> = ["start".to_string()].into();
    for (name, _) in &rules {
        if names.contains_key(name.as_str()) {
            return Err(format!("GBNF grammar: rule '{name}' is defined twice"));
        }
        let mut lark: String = name.chars().map(|c| c.to_ascii_lowercase()).collect();
        if !lark.starts_with(|c: char| c.is_ascii_lowercase()) {
            lark.insert_str(0, "r_");
        }
        let base = lark.clone();
        let mut k = 1;
        while taken.contains(&lark) {
            lark = format!("{base}_{k}");
            k += 1;
        }
        taken.insert(lark.clone());
        names.insert(name, lark);
    }
    let root = names.get("root").ok_or("GBNF grammar: there is no 'root' rule (the start)")?;
    let mut out = format!("start: {root}\n");
    for (name, alts) in &rules {
        out.push_str(&names[name.as_str()]);
        out.push_str(": ");
        emit_alternatives(&mut out, alts, &names)?;
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_terms_and_repetitions_are_rewritten() {
        let g = "root ::= answer (\" \" Answer)*  # comment\nanswer ::= \"yes\" | \"no\"\nAnswer ::= [a-c^] .? x{2,3}\nx ::= [^\\n\"]{2}\n";
        let lark = to_lark(g).unwrap();
        let lines: Vec<&str> = lark.lines().collect();
        assert_eq!(lines[0], "start: root");
        assert_eq!(lines[1], r#"root: answer (" " answer_1)*"#);
        assert_eq!(lines[2], r#"answer: "yes" | "no""#);
        assert_eq!(lines[3], r"answer_1: /[\x{61}-\x{63}\x{5e}]/ /(?s:.)/? x{2,3}");
        assert_eq!(lines[4], r#"x: /[^\x{a}\x{22}]/{2,2}"#);
        assert_eq!(to_lark("root ::= \"a\"+? \"b\"{0}").unwrap().lines().nth(1), Some(r#"root: ("a"+)? """#));
    }

    #[test]
    fn rules_may_continue_inside_groups_and_after_bars() {
        let g = "root ::= (\n  \"a\"\n  \"b\" ) |\n  \"c\"\n\nnext ::= \"\\x41\\u00e9\" \"\"\n";
        let lark = to_lark(g).unwrap();
        assert!(lark.contains("root: (\"a\" \"b\") | \"c\""), "{lark}");
        assert!(lark.contains("next: \"Aé\" \"\""), "{lark}");
    }

    #[test]
    fn mistakes_are_named_with_their_place() {
        for (g, says) in [
            ("root ::= \"a\" b", "rule 'b' is used but not defined"),
            ("answer ::= \"a\"", "no 'root' rule"),
            ("root ::= \"a", "not closed"),
            ("root ::= [a-", "unexpected end"),
            ("root ::= [z-a]", "runs backwards"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("root ::= (\"a\"", "expected ')'"),
            ("root ::= \"a\"{3,1}", "maximum below its minimum"),
            ("root = \"a\"", "expected '::='"),
        ] {
            let e = to_lark(g).unwrap_err();
            assert!(e.contains(says), "{g:?}: {e}");
        }
        assert!(to_lark("root ::= \"a\" )").unwrap_err().contains("line 1, column 14"));
    }

    #[test]
    fn gbnf_is_told_from_lark() {
        assert!(looks_like_gbnf("# c\nroot ::= \"a\""));
        assert!(looks_like_gbnf("  my-rule::= \"a\""));
        assert!(!looks_like_gbnf("start: \"a\" | \"b\""));
        assert!(!looks_like_gbnf("%llguidance {}\nstart: x\nx: \"::=\""));
    }
}
