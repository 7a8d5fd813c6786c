//! JSON as the Python side reads and writes it.
//!
//! The reader is strict RFC 8259 (what msgspec and orjson accept), over bytes the caller has
//! checked as UTF-8. Whatever it is not sure to read exactly as they do (a duplicate key, a
//! lone surrogate, a float beyond the range of a double or one that underflows to zero,
//! nesting deeper than [`MAX_DEPTH`]) is [`NotMine`]: the Python path decides.
//!
//! The writer writes what `orjson.dumps` writes (compact; `"`, `\` and control characters
//! escaped, `\b \t \n \f \r` short, the others as `\u00xx`; everything else as it is; floats
//! as orjson formats them), and with `seps` what `rl_export.model.codec.dumps` writes: the
//! same, with U+2028 and U+2029 escaped.

use std::borrow::Cow;

/// The native core cannot decide: the Python path (the reference) does.
#[derive(Debug)]
pub struct NotMine;

pub type R<T> = Result<T, NotMine>;

/// Deeper nesting goes to the Python path (orjson refuses to write beyond 254 levels).
pub const MAX_DEPTH: usize = 64;

/// A JSON number: an integer (JSON without fraction or exponent) or a float.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Num {
    Int(i64),
    Float(f64),
}

/// A parsed JSON value; objects keep their keys in order (no key twice).
#[derive(Debug)]
pub enum Val<'a> {
    Null,
    Bool(bool),
    Num(Num),
    Str(Cow<'a, str>),
    Arr(Vec<Val<'a>>),
    Obj(Vec<(Cow<'a, str>, Val<'a>)>),
}

impl<'a> Val<'a> {
    pub fn get(&self, key: &str) -> Option<&Val<'a>> {
        match self {
            Val::Obj(items) => items.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

pub struct Reader<'a> {
    pub b: &'a [u8],
    pub i: usize,
}

#[inline]
fn is_digit(c: u8) -> bool {
    c.is_ascii_digit()
}

/// Bytes that end the plain run of a string: the quote, the backslash, control characters.
static STOPS: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        table[c] = true;
        c += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// The index of the first byte at or after `from` that ends a plain run (or the length).
#[inline]
fn plain_run(b: &[u8], from: usize) -> usize {
    let mut i = from;
    while i < b.len() && !STOPS[b[i] as usize] {
        i += 1;
    }
    i
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b, i: 0 }
    }

    pub fn at(b: &'a [u8], i: usize) -> Self {
        Reader { b, i }
    }

    #[inline]
    pub fn ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if c == b' ' || c == b'\n' || c == b'\r' || c == b'\t' {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    #[inline]
    pub fn peek(&mut self) -> R<u8> {
        self.ws();
        self.b.get(self.i).copied().ok_or(NotMine)
    }

    #[inline]
    pub fn expect(&mut self, c: u8) -> R<()> {
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            Err(NotMine)
        }
    }

    /// Only whitespace is left.
    pub fn end(&mut self) -> R<()> {
        self.ws();
        if self.i == self.b.len() {
            Ok(())
        } else {
            Err(NotMine)
        }
    }

    fn literal(&mut self, text: &[u8]) -> R<()> {
        if self.b[self.i..].starts_with(text) {
            self.i += text.len();
            Ok(())
        } else {
            Err(NotMine)
        }
    }

    /// After `{` or `[`: the next member, or None at the closing bracket.
    #[inline]
    fn more(&mut self, first: &mut bool, close: u8) -> R<bool> {
        let c = self.peek()?;
        if c == close {
            self.i += 1;
            return Ok(false);
        }
        if !*first {
            if c != b',' {
                return Err(NotMine);
            }
            self.i += 1;
        }
        *first = false;
        Ok(true)
    }

    /// The next key of an object (the reader is after `{` or after a value), or None at `}`.
    #[inline]
    pub fn key(&mut self, first: &mut bool) -> R<Option<Cow<'a, str>>> {
        if !self.more(first, b'}')? {
            return Ok(None);
        }
        let key = self.string()?;
        self.expect(b':')?;
        Ok(Some(key))
    }

    /// True while the array (the reader is after `[` or after an item) has one more item.
    #[inline]
    pub fn item(&mut self, first: &mut bool) -> R<bool> {
        self.more(first, b']')
    }

    /// A string (whitespace first is skipped).
    pub fn string(&mut self) -> R<Cow<'a, str>> {
        if self.peek()? != b'"' {
            return Err(NotMine);
        }
        self.i += 1;
        let start = self.i;
        let b = self.b;
        self.i = plain_run(b, start);
        match b.get(self.i) {
            Some(b'"') => {
                let text = &b[start..self.i];
                self.i += 1;
                // The caller checked the whole input as UTF-8; quotes are ASCII.
                return Ok(Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(text) }));
            }
            Some(b'\\') => {}
            _ => return Err(NotMine), // a control character, or the end
        }
        let mut out: Vec<u8> = b[start..self.i].to_vec();
        loop {
            let c = *b.get(self.i).ok_or(NotMine)?;
            self.i += 1;
            match c {
                b'"' => {
                    return String::from_utf8(out).map(Cow::Owned).map_err(|_| NotMine);
                }
                b'\\' => {
                    let e = *b.get(self.i).ok_or(NotMine)?;
                    self.i += 1;
                    match e {
                        b'"' => out.push(b'"'),
                        b'\\' => out.push(b'\\'),
                        b'/' => out.push(b'/'),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => {
                            let mut code = self.hex4()?;
                            if (0xDC00..0xE000).contains(&code) {
                                return Err(NotMine); // a lone low surrogate
                            }
                            if (0xD800..0xDC00).contains(&code) {
                                if !b[self.i..].starts_with(b"\\u") {
                                    return Err(NotMine);
                                }
                                self.i += 2;
                                let low = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&low) {
                                    return Err(NotMine);
                                }
                                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                            }
                            let ch = char::from_u32(code).ok_or(NotMine)?;
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                        _ => return Err(NotMine),
                    }
                }
                c if c < 0x20 => return Err(NotMine),
                c => out.push(c),
            }
        }
    }

    fn hex4(&mut self) -> R<u32> {
        let digits = self.b.get(self.i..self.i + 4).ok_or(NotMine)?;
        let mut code = 0u32;
        for &d in digits {
            let v = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return Err(NotMine),
            };
            code = code * 16 + v as u32;
        }
        self.i += 4;
        Ok(code)
    }

    /// A number, by JSON's grammar: an integer (which must fit 64 bits: the callers refuse
    /// 19 digits in a row first) or a float (finite, and not a non-zero written that reads 0).
    pub fn number(&mut self) -> R<Num> {
        self.ws();
        let b = self.b;
        let start = self.i;
        let mut i = self.i;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(c) if is_digit(*c) => {
                while b.get(i).is_some_and(|c| is_digit(*c)) {
                    i += 1;
                }
            }
            _ => return Err(NotMine),
        }
        let mut float = false;
        let mut mantissa_end = i;
        if b.get(i) == Some(&b'.') {
            i += 1;
            if !b.get(i).is_some_and(|c| is_digit(*c)) {
                return Err(NotMine);
            }
            while b.get(i).is_some_and(|c| is_digit(*c)) {
                i += 1;
            }
            float = true;
            mantissa_end = i;
        }
        if matches!(b.get(i), Some(b'e') | Some(b'E')) {
            i += 1;
            if matches!(b.get(i), Some(b'+') | Some(b'-')) {
                i += 1;
            }
            if !b.get(i).is_some_and(|c| is_digit(*c)) {
                return Err(NotMine);
            }
            while b.get(i).is_some_and(|c| is_digit(*c)) {
                i += 1;
            }
            float = true;
        }
        self.i = i;
        let text = unsafe { std::str::from_utf8_unchecked(&b[start..i]) };
        if float {
            let v: f64 = text.parse().map_err(|_| NotMine)?;
            if !v.is_finite() {
                return Err(NotMine);
            }
            if v == 0.0 && b[start..mantissa_end].iter().any(|c| (b'1'..=b'9').contains(c)) {
                return Err(NotMine); // underflow: how each parser rounds it is not ours to say
            }
            Ok(Num::Float(v))
        } else {
            text.parse::<i64>().map(Num::Int).map_err(|_| NotMine)
        }
    }

    /// A value, parsed.
    pub fn value(&mut self, depth: usize) -> R<Val<'a>> {
        match self.peek()? {
            b'"' => Ok(Val::Str(self.string()?)),
            b'{' => {
                if depth >= MAX_DEPTH {
                    return Err(NotMine);
                }
                self.i += 1;
                let mut items: Vec<(Cow<'a, str>, Val<'a>)> = Vec::new();
                let mut first = true;
                while let Some(key) = self.key(&mut first)? {
                    if items.iter().any(|(k, _)| *k == key) {
                        return Err(NotMine);
                    }
                    let value = self.value(depth + 1)?;
                    items.push((key, value));
                }
                Ok(Val::Obj(items))
            }
            b'[' => {
                if depth >= MAX_DEPTH {
                    return Err(NotMine);
                }
                self.i += 1;
                let mut items = Vec::new();
                let mut first = true;
                while self.item(&mut first)? {
                    items.push(self.value(depth + 1)?);
                }
                Ok(Val::Arr(items))
            }
            b't' => self.literal(b"true").map(|_| Val::Bool(true)),
            b'f' => self.literal(b"false").map(|_| Val::Bool(false)),
            b'n' => self.literal(b"null").map(|_| Val::Null),
            _ => Ok(Val::Num(self.number()?)),
        }
    }

    /// Copy a value as `orjson.dumps(orjson.loads(value))` writes it (no separators escaped).
    pub fn copy(&mut self, out: &mut Vec<u8>, depth: usize) -> R<()> {
        match self.peek()? {
            b'"' => {
                // Without a backslash the bytes are what orjson writes (no control characters
                // or quotes can be in them): copied as they are.
                let start = self.i;
                let end = plain_run(self.b, start + 1);
                if self.b.get(end) == Some(&b'"') {
                    self.i = end + 1;
                    out.extend_from_slice(&self.b[start..self.i]);
                    return Ok(());
                }
                let s = self.string()?;
                write_str(out, &s, false);
                Ok(())
            }
            b'{' => {
                if depth >= MAX_DEPTH {
                    return Err(NotMine);
                }
                self.i += 1;
                out.push(b'{');
                let mut keys: Vec<Cow<'a, str>> = Vec::new();
                let mut first = true;
                while let Some(key) = self.key(&mut first)? {
                    if keys.contains(&key) {
                        return Err(NotMine);
                    }
                    if !keys.is_empty() {
                        out.push(b',');
                    }
                    write_str(out, &key, false);
                    out.push(b':');
                    keys.push(key);
                    self.copy(out, depth + 1)?;
                }
                out.push(b'}');
                Ok(())
            }
            b'[' => {
                if depth >= MAX_DEPTH {
                    return Err(NotMine);
                }
                self.i += 1;
                out.push(b'[');
                let mut first = true;
                while self.item(&mut first)? {
                    if out.last() != Some(&b'[') {
                        out.push(b','); // an item never ends with `[`: this is not the first
                    }
                    self.copy(out, depth + 1)?;
                }
                out.push(b']');
                Ok(())
            }
            b't' => {
                self.literal(b"true")?;
                out.extend_from_slice(b"true");
                Ok(())
            }
            b'f' => {
                self.literal(b"false")?;
                out.extend_from_slice(b"false");
                Ok(())
            }
            b'n' => {
                self.literal(b"null")?;
                out.extend_from_slice(b"null");
                Ok(())
            }
            _ => {
                write_num(out, self.number()?);
                Ok(())
            }
        }
    }

    /// Skip a value, checking it is JSON (what msgspec's `Raw` checks).
    pub fn skip(&mut self, depth: usize) -> R<()> {
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' => {
                if depth >= MAX_DEPTH {
                    return Err(NotMine);
                }
                self.i += 1;
                let mut first = true;
                while self.key(&mut first)?.is_some() {
                    self.skip(depth + 1)?;
                }
                Ok(())
            }
            b'[' => {
                if depth >= MAX_DEPTH {
                    return Err(NotMine);
                }
                self.i += 1;
                let mut first = true;
                while self.item(&mut first)? {
                    self.skip(depth + 1)?;
                }
                Ok(())
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(|_| ()),
        }
    }
}

// --- writing ---------------------------------------------------------------------------------

const HEX: &[u8; 16] = b"0123456789abcdef";

/// What `orjson` writes for byte `c` of a string, when not the byte itself.
#[inline]
fn escape_of(c: u8) -> Option<&'static [u8]> {
    match c {
        b'"' => Some(b"\\\""),
        b'\\' => Some(b"\\\\"),
        8 => Some(b"\\b"),
        9 => Some(b"\\t"),
        10 => Some(b"\\n"),
        12 => Some(b"\\f"),
        13 => Some(b"\\r"),
        _ => None,
    }
}

/// A string as orjson writes it; with `seps`, U+2028 and U+2029 escaped too.
pub fn write_str(out: &mut Vec<u8>, s: &str, seps: bool) {
    let b = s.as_bytes();
    out.reserve(b.len() + 2);
    out.push(b'"');
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if !(STOPS[c as usize] || seps && c == 0xE2) {
            i += 1;
            continue;
        }
        if c == 0xE2 {
            if b[i + 1] == 0x80 && (b[i + 2] == 0xA8 || b[i + 2] == 0xA9) {
                out.extend_from_slice(&b[start..i]);
                out.extend_from_slice(if b[i + 2] == 0xA8 { b"\\u2028" } else { b"\\u2029" });
                i += 3;
                start = i;
            } else {
                i += 1;
            }
            continue;
        }
        out.extend_from_slice(&b[start..i]);
        match escape_of(c) {
            Some(e) => out.extend_from_slice(e),
            None => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(c >> 4) as usize]);
                out.push(HEX[(c & 15) as usize]);
            }
        }
        i += 1;
        start = i;
    }
    out.extend_from_slice(&b[start..]);
    out.push(b'"');
}

/// JSON bytes written as they are; with `seps`, U+2028 and U+2029 escaped (only strings can
/// hold them), as `rl_export.model.codec.escape_separators` does.
pub fn write_raw(out: &mut Vec<u8>, json: &[u8], seps: bool) {
    if !seps || !json.contains(&0xE2) {
        out.extend_from_slice(json);
        return;
    }
    let mut start = 0;
    let mut i = 0;
    while i + 2 < json.len() {
        if json[i] == 0xE2 && json[i + 1] == 0x80 && (json[i + 2] == 0xA8 || json[i + 2] == 0xA9) {
            out.extend_from_slice(&json[start..i]);
            out.extend_from_slice(if json[i + 2] == 0xA8 { b"\\u2028" } else { b"\\u2029" });
            i += 3;
            start = i;
        } else {
            i += 1;
        }
    }
    out.extend_from_slice(&json[start..]);
}

pub fn write_i64(out: &mut Vec<u8>, v: i64) {
    let mut buf = [0u8; 20];
    let mut n = v.unsigned_abs();
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[at..]);
}

/// A finite float as orjson writes it: the shortest digits that read back as the same
/// double, in plain notation when its decimal exponent is in -5..16 (at least one digit
/// after the point), else as `d[.ddd]e±x`.
pub fn write_f64(out: &mut Vec<u8>, v: f64) {
    write_float(out, v, -5, 1);
}

/// A finite float as Python's ``repr`` writes it (plain for exponents in -4..16, else with
/// an exponent of at least two digits): the expiry index's times.
pub fn write_repr(out: &mut Vec<u8>, v: f64) {
    write_float(out, v, -4, 2);
}

/// The shortest digits of `v`, plain when its decimal exponent is in `low..16`, else as
/// `d[.ddd]e±x` with at least `width` exponent digits.
fn write_float(out: &mut Vec<u8>, v: f64, low: i32, width: usize) {
    let mut buf = ryu::Buffer::new();
    let text = buf.format_finite(v).as_bytes();
    let (negative, text) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        _ => (false, text),
    };
    let (mantissa, exponent) = match text.iter().position(|&c| c == b'e' || c == b'E') {
        Some(at) => {
            let e = std::str::from_utf8(&text[at + 1..]).unwrap().parse::<i32>().unwrap();
            (&text[..at], e)
        }
        None => (text, 0),
    };
    // mantissa = digits with an optional point: the value is 0.D x 10^point.
    let mut digits: Vec<u8> = Vec::with_capacity(24);
    let mut point: i32 = -1;
    for (n, &c) in mantissa.iter().enumerate() {
        if c == b'.' {
            point = n as i32;
        } else {
            digits.push(c);
        }
    }
    if point < 0 {
        point = digits.len() as i32;
    }
    point += exponent;
    let leading = digits.iter().take_while(|&&c| c == b'0').count();
    digits.drain(..leading);
    point -= leading as i32;
    while digits.last() == Some(&b'0') {
        digits.pop();
    }
    if negative {
        out.push(b'-');
    }
    if digits.is_empty() {
        out.extend_from_slice(b"0.0");
        return;
    }
    let k = point - 1; // the decimal exponent: d.ddd x 10^k
    if (low..16).contains(&k) {
        if k >= 0 {
            let whole = (k + 1) as usize;
            if digits.len() <= whole {
                out.extend_from_slice(&digits);
                out.extend(std::iter::repeat_n(b'0', whole - digits.len()));
                out.extend_from_slice(b".0");
            } else {
                out.extend_from_slice(&digits[..whole]);
                out.push(b'.');
                out.extend_from_slice(&digits[whole..]);
            }
        } else {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', (-k - 1) as usize));
            out.extend_from_slice(&digits);
        }
    } else {
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if k < 0 { b'-' } else { b'+' });
        if k.abs() < 10 && width == 2 {
            out.push(b'0');
        }
        write_i64(out, k.abs() as i64);
    }
}

pub fn write_num(out: &mut Vec<u8>, n: Num) {
    match n {
        Num::Int(v) => write_i64(out, v),
        Num::Float(v) => write_f64(out, v),
    }
}

pub fn write_opt_f64(out: &mut Vec<u8>, v: Option<f64>) {
    match v {
        Some(v) => write_f64(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

pub fn write_opt_bool(out: &mut Vec<u8>, v: Option<bool>) {
    out.extend_from_slice(match v {
        Some(true) => b"true",
        Some(false) => b"false",
        None => b"null",
    });
}

pub fn write_val(out: &mut Vec<u8>, v: &Val<'_>, seps: bool) {
    match v {
        Val::Null => out.extend_from_slice(b"null"),
        Val::Bool(true) => out.extend_from_slice(b"true"),
        Val::Bool(false) => out.extend_from_slice(b"false"),
        Val::Num(n) => write_num(out, *n),
        Val::Str(s) => write_str(out, s, seps),
        Val::Arr(items) => {
            out.push(b'[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write_val(out, item, seps);
            }
            out.push(b']');
        }
        Val::Obj(items) => {
            out.push(b'{');
            for (n, (k, item)) in items.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write_str(out, k, seps);
                out.push(b':');
                write_val(out, item, seps);
            }
            out.push(b'}');
        }
    }
}

/// An object written member by member: `{`, then each `"key":value` with its comma.
pub struct Obj<'o> {
    pub out: &'o mut Vec<u8>,
    first: bool,
    seps: bool,
}

impl<'o> Obj<'o> {
    pub fn new(out: &'o mut Vec<u8>, seps: bool) -> Self {
        out.push(b'{');
        Obj { out, first: true, seps }
    }

    /// Start a member: its key is written, its value is the caller's to write.
    pub fn key(&mut self, key: &str) -> &mut Vec<u8> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        write_str(self.out, key, self.seps);
        self.out.push(b':');
        self.out
    }

    pub fn close(self) {
        self.out.push(b'}');
    }
}
