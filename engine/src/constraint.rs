//! Placement constraints: expressions over host attributes, compiled once
//! and evaluated to a bitmap of hosts with bitmap algebra.
//!
//! Syntax (whitespace free-form; words are letters, digits and `_ . - / :`,
//! or double-quoted):
//!
//! ```text
//! expr  := and ( ("||" | "or") and )*
//! and   := unary ( ("&&" | "and") unary )*
//! unary := ("!" | "not") unary | "(" expr ")" | atom
//! atom  := "exists" KEY | KEY "==" VALUE | KEY "!=" VALUE
//!        | KEY "in" "{" VALUE ("," VALUE)* "}"
//! ```
//!
//! `key != value` holds for hosts without `key` too (it is `!(key == value)`).

use std::collections::HashMap;
use std::fmt;

use roaring::RoaringBitmap;

use crate::host::{HostArena, is_word_char};
use crate::intern::{Interner, Sym};

/// Longest constraint text, in bytes.
pub const MAX_CONSTRAINT_LEN: usize = 4096;
/// Deepest nesting of a constraint.
pub const MAX_CONSTRAINT_DEPTH: usize = 32;

/// A compiled constraint.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Constraint {
    /// Every host.
    True,
    /// `key == value`.
    Eq(Sym, Sym),
    /// `key != value` (hosts without the key match).
    Ne(Sym, Sym),
    /// `key in {v1, v2, …}`.
    In(Sym, Box<[Sym]>),
    /// `exists key`.
    Exists(Sym),
    /// All of.
    And(Box<[Constraint]>),
    /// Any of.
    Or(Box<[Constraint]>),
    /// Not.
    Not(Box<Constraint>),
}

/// Why a constraint text does not compile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("constraint {text:?}: at byte {position}: {problem}")]
pub struct ConstraintError {
    /// The text (cut to 200 characters).
    pub text: String,
    /// Byte offset of the problem.
    pub position: usize,
    /// What is wrong.
    pub problem: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    EqEq,
    NotEq,
    Not,
    And,
    Or,
    Open,
    Close,
    OpenBrace,
    CloseBrace,
    Comma,
}

struct Parser<'a> {
    text: &'a str,
    tokens: Vec<(usize, Token)>,
    at: usize,
    interner: &'a mut Interner,
}

impl Constraint {
    /// Compiles a constraint; an empty text is [`Constraint::True`].
    pub fn parse(text: &str, interner: &mut Interner) -> Result<Constraint, ConstraintError> {
        let error = |position: usize, problem: String| ConstraintError {
            text: text.chars().take(200).collect(),
            position,
            problem,
        };
        if text.len() > MAX_CONSTRAINT_LEN {
            return Err(error(
                MAX_CONSTRAINT_LEN,
                format!("longer than {MAX_CONSTRAINT_LEN} bytes"),
            ));
        }
        let tokens = tokenize(text).map_err(|(p, m)| error(p, m))?;
        if tokens.is_empty() {
            return Ok(Constraint::True);
        }
        let mut parser = Parser {
            text,
            tokens,
            at: 0,
            interner,
        };
        let c = parser.expr(0).map_err(|(p, m)| error(p, m))?;
        if let Some((p, t)) = parser.tokens.get(parser.at) {
            return Err(error(
                *p,
                format!("unexpected {t:?} after a complete expression"),
            ));
        }
        let _ = parser.text;
        Ok(c)
    }

    /// True if the constraint names `key` anywhere (an exclusive host only
    /// takes tasks whose constraint names the `exclusive` key).
    pub fn mentions(&self, key: Sym) -> bool {
        match self {
            Constraint::True => false,
            Constraint::Eq(k, _)
            | Constraint::Ne(k, _)
            | Constraint::In(k, _)
            | Constraint::Exists(k) => *k == key,
            Constraint::And(cs) | Constraint::Or(cs) => cs.iter().any(|c| c.mentions(key)),
            Constraint::Not(c) => c.mentions(key),
        }
    }

    /// Whether a host with these (sorted) attributes matches: the
    /// definition that [`Constraint::evaluate`] computes with bitmaps.
    pub fn matches(&self, attributes: &[(Sym, Sym)]) -> bool {
        let value_of = |key: Sym| attributes.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        match self {
            Constraint::True => true,
            Constraint::Eq(k, v) => value_of(*k) == Some(*v),
            Constraint::Ne(k, v) => value_of(*k) != Some(*v),
            Constraint::In(k, vs) => value_of(*k).is_some_and(|v| vs.contains(&v)),
            Constraint::Exists(k) => value_of(*k).is_some(),
            Constraint::And(cs) => cs.iter().all(|c| c.matches(attributes)),
            Constraint::Or(cs) => cs.iter().any(|c| c.matches(attributes)),
            Constraint::Not(c) => !c.matches(attributes),
        }
    }

    /// The live hosts that match, by bitmap algebra: conjunctions intersect
    /// their smallest operands first and stop when empty.
    pub fn evaluate(&self, hosts: &HostArena) -> RoaringBitmap {
        let empty = RoaringBitmap::new();
        match self {
            Constraint::True => hosts.live_hosts().clone(),
            Constraint::Eq(k, v) => hosts.with_value(*k, *v).unwrap_or(&empty).clone(),
            Constraint::Ne(k, v) => hosts.live_hosts() - hosts.with_value(*k, *v).unwrap_or(&empty),
            Constraint::In(k, vs) => {
                let mut out = RoaringBitmap::new();
                for v in vs.iter() {
                    if let Some(b) = hosts.with_value(*k, *v) {
                        out |= b;
                    }
                }
                out
            }
            Constraint::Exists(k) => hosts.with_key(*k).unwrap_or(&empty).clone(),
            Constraint::And(cs) => {
                let mut parts: Vec<RoaringBitmap> = Vec::with_capacity(cs.len());
                for c in cs.iter() {
                    let part = c.evaluate(hosts);
                    if part.is_empty() {
                        return part;
                    }
                    parts.push(part);
                }
                parts.sort_by_key(RoaringBitmap::len);
                let mut parts = parts.into_iter();
                let mut out = parts.next().unwrap_or_else(|| hosts.live_hosts().clone());
                for part in parts {
                    out &= part;
                    if out.is_empty() {
                        break;
                    }
                }
                out
            }
            Constraint::Or(cs) => {
                let mut out = RoaringBitmap::new();
                for c in cs.iter() {
                    out |= c.evaluate(hosts);
                }
                out
            }
            Constraint::Not(c) => hosts.live_hosts() - c.evaluate(hosts),
        }
    }

    /// A printable form with names resolved.
    pub fn display<'a>(&'a self, interner: &'a Interner) -> impl fmt::Display + 'a {
        DisplayConstraint { c: self, interner }
    }
}

struct DisplayConstraint<'a> {
    c: &'a Constraint,
    interner: &'a Interner,
}

impl fmt::Display for DisplayConstraint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |s: Sym| self.interner.resolve(s);
        match self.c {
            Constraint::True => f.write_str("true"),
            Constraint::Eq(k, v) => write!(f, "{}=={}", name(*k), name(*v)),
            Constraint::Ne(k, v) => write!(f, "{}!={}", name(*k), name(*v)),
            Constraint::In(k, vs) => {
                write!(f, "{} in {{", name(*k))?;
                for (i, v) in vs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(name(*v))?;
                }
                f.write_str("}")
            }
            Constraint::Exists(k) => write!(f, "exists {}", name(*k)),
            Constraint::And(cs) | Constraint::Or(cs) => {
                let op = if matches!(self.c, Constraint::And(_)) {
                    " && "
                } else {
                    " || "
                };
                f.write_str("(")?;
                for (i, c) in cs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(op)?;
                    }
                    write!(
                        f,
                        "{}",
                        DisplayConstraint {
                            c,
                            interner: self.interner
                        }
                    )?;
                }
                f.write_str(")")
            }
            Constraint::Not(c) => write!(
                f,
                "!{}",
                DisplayConstraint {
                    c,
                    interner: self.interner
                }
            ),
        }
    }
}

fn tokenize(text: &str) -> Result<Vec<(usize, Token)>, (usize, String)> {
    let mut tokens = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        let two = text.get(i..i + 2);
        match c {
            _ if c.is_ascii_whitespace() => i += 1,
            '(' => {
                tokens.push((i, Token::Open));
                i += 1;
            }
            ')' => {
                tokens.push((i, Token::Close));
                i += 1;
            }
            '{' => {
                tokens.push((i, Token::OpenBrace));
                i += 1;
            }
            '}' => {
                tokens.push((i, Token::CloseBrace));
                i += 1;
            }
            ',' => {
                tokens.push((i, Token::Comma));
                i += 1;
            }
            '=' if two == Some("==") => {
                tokens.push((i, Token::EqEq));
                i += 2;
            }
            '!' if two == Some("!=") => {
                tokens.push((i, Token::NotEq));
                i += 2;
            }
            '!' => {
                tokens.push((i, Token::Not));
                i += 1;
            }
            '&' if two == Some("&&") => {
                tokens.push((i, Token::And));
                i += 2;
            }
            '|' if two == Some("||") => {
                tokens.push((i, Token::Or));
                i += 2;
            }
            '"' => {
                let end = text[i + 1..]
                    .find('"')
                    .ok_or((i, "unterminated quoted word".to_owned()))?;
                let word = &text[i + 1..i + 1 + end];
                crate::host::validate_attribute_word(word).map_err(|p| (i, p))?;
                tokens.push((i, Token::Word(word.to_owned())));
                i += end + 2;
            }
            _ if is_word_char(c) => {
                let start = i;
                while i < bytes.len() && is_word_char(bytes[i] as char) {
                    i += 1;
                }
                let word = &text[start..i];
                let token = match word {
                    "and" => Token::And,
                    "or" => Token::Or,
                    "not" => Token::Not,
                    _ => {
                        crate::host::validate_attribute_word(word).map_err(|p| (start, p))?;
                        Token::Word(word.to_owned())
                    }
                };
                tokens.push((start, token));
            }
            _ => return Err((i, format!("unexpected character {c:?}"))),
        }
    }
    Ok(tokens)
}

type ParseResult<T> = Result<T, (usize, String)>;

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at).map(|(_, t)| t)
    }

    fn position(&self) -> usize {
        self.tokens
            .get(self.at)
            .map_or(self.text.len(), |(p, _)| *p)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.at).map(|(_, t)| t.clone());
        self.at += 1;
        t
    }

    fn expect_word(&mut self, what: &str) -> ParseResult<String> {
        let position = self.position();
        match self.next() {
            Some(Token::Word(w)) => Ok(w),
            Some(t) => Err((position, format!("expected {what}, found {t:?}"))),
            None => Err((position, format!("expected {what}, found the end"))),
        }
    }

    fn expr(&mut self, depth: usize) -> ParseResult<Constraint> {
        if depth > MAX_CONSTRAINT_DEPTH {
            return Err((
                self.position(),
                format!("nested deeper than {MAX_CONSTRAINT_DEPTH}"),
            ));
        }
        let mut parts = vec![self.and(depth)?];
        while self.peek() == Some(&Token::Or) {
            self.at += 1;
            parts.push(self.and(depth)?);
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            Constraint::Or(parts.into())
        })
    }

    fn and(&mut self, depth: usize) -> ParseResult<Constraint> {
        let mut parts = vec![self.unary(depth)?];
        while self.peek() == Some(&Token::And) {
            self.at += 1;
            parts.push(self.unary(depth)?);
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            Constraint::And(parts.into())
        })
    }

    fn unary(&mut self, depth: usize) -> ParseResult<Constraint> {
        if depth > MAX_CONSTRAINT_DEPTH {
            return Err((
                self.position(),
                format!("nested deeper than {MAX_CONSTRAINT_DEPTH}"),
            ));
        }
        match self.peek() {
            Some(Token::Not) => {
                self.at += 1;
                Ok(Constraint::Not(Box::new(self.unary(depth + 1)?)))
            }
            Some(Token::Open) => {
                self.at += 1;
                let inner = self.expr(depth + 1)?;
                let position = self.position();
                match self.next() {
                    Some(Token::Close) => Ok(inner),
                    _ => Err((position, "expected ')'".to_owned())),
                }
            }
            _ => self.atom(),
        }
    }

    fn atom(&mut self) -> ParseResult<Constraint> {
        let position = self.position();
        let first = self.expect_word("a key or 'exists'")?;
        if first == "exists" && matches!(self.peek(), Some(Token::Word(_))) {
            let key = self.expect_word("a key")?;
            return Ok(Constraint::Exists(self.interner.intern(&key)));
        }
        let key = self.interner.intern(&first);
        let operator_position = self.position();
        match self.next() {
            Some(Token::EqEq) => {
                let value = self.expect_word("a value")?;
                Ok(Constraint::Eq(key, self.interner.intern(&value)))
            }
            Some(Token::NotEq) => {
                let value = self.expect_word("a value")?;
                Ok(Constraint::Ne(key, self.interner.intern(&value)))
            }
            Some(Token::Word(w)) if w == "in" => {
                let brace = self.position();
                if self.next() != Some(Token::OpenBrace) {
                    return Err((brace, "expected '{' after 'in'".to_owned()));
                }
                let mut values = Vec::new();
                loop {
                    let value = self.expect_word("a value")?;
                    values.push(self.interner.intern(&value));
                    let p = self.position();
                    match self.next() {
                        Some(Token::Comma) => continue,
                        Some(Token::CloseBrace) => break,
                        _ => return Err((p, "expected ',' or '}'".to_owned())),
                    }
                }
                values.sort_unstable();
                values.dedup();
                Ok(Constraint::In(key, values.into()))
            }
            Some(t) => Err((
                operator_position,
                format!("expected '==', '!=' or 'in' after {first:?}, found {t:?}"),
            )),
            None => Err((
                position,
                format!("{first:?} needs '==', '!=' or 'in' and a value"),
            )),
        }
    }
}

/// Candidate bitmaps per distinct constraint, computed once per batch.
#[derive(Debug, Default)]
pub struct ConstraintCache {
    evaluated: rustc_hash::FxHashMap<Constraint, RoaringBitmap>,
}

impl ConstraintCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets every result (call when hosts change between batches).
    pub fn clear(&mut self) {
        self.evaluated.clear();
    }

    /// The hosts matching `constraint`, if already evaluated in this batch.
    pub fn get(&self, constraint: &Constraint) -> Option<&RoaringBitmap> {
        self.evaluated.get(constraint)
    }

    /// The hosts matching `constraint`, evaluated at most once per batch.
    pub fn evaluate(&mut self, constraint: &Constraint, hosts: &HostArena) -> &RoaringBitmap {
        if !self.evaluated.contains_key(constraint) {
            let bitmap = constraint.evaluate(hosts);
            self.evaluated.insert(constraint.clone(), bitmap);
        }
        &self.evaluated[constraint]
    }
}

/// Distinct constraints by number; number 0 is [`Constraint::True`]. Tasks
/// store the number, so each distinct text is compiled once.
#[derive(Clone, Debug)]
pub struct ConstraintTable {
    constraints: Vec<Constraint>,
    texts: Vec<Box<str>>,
    by_text: HashMap<Box<str>, u32>,
}

impl Default for ConstraintTable {
    fn default() -> Self {
        let mut table = ConstraintTable {
            constraints: Vec::new(),
            texts: Vec::new(),
            by_text: HashMap::new(),
        };
        table.constraints.push(Constraint::True);
        table.texts.push("".into());
        table.by_text.insert("".into(), 0);
        table
    }
}

impl ConstraintTable {
    /// A table holding only the empty constraint.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of `text`, compiling it the first time. Texts that
    /// compile to the same expression (they differ only in spacing, quoting,
    /// or the order of `in` values) share a number, so their tasks share a
    /// placement class.
    pub fn intern(&mut self, text: &str, interner: &mut Interner) -> Result<u32, ConstraintError> {
        let text = text.trim();
        if let Some(&id) = self.by_text.get(text) {
            return Ok(id);
        }
        let constraint = Constraint::parse(text, interner)?;
        let canonical = match constraint {
            Constraint::True => String::new(),
            ref c => c.display(interner).to_string(),
        };
        let id = match self.by_text.get(canonical.as_str()) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(self.constraints.len()).expect("constraints fit in u32");
                self.constraints.push(constraint);
                self.texts.push(text.into());
                self.by_text.insert(canonical.into(), id);
                id
            }
        };
        self.by_text.insert(text.into(), id);
        Ok(id)
    }

    /// The constraint with number `id`.
    pub fn get(&self, id: u32) -> Option<&Constraint> {
        self.constraints.get(id as usize)
    }

    /// The text constraint `id` was compiled from.
    pub fn text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(|t| &**t)
    }

    /// Number of distinct constraints (the empty one included).
    pub fn len(&self) -> usize {
        self.constraints.len()
    }

    /// Never true: the empty constraint is always there.
    pub fn is_empty(&self) -> bool {
        false
    }
}
