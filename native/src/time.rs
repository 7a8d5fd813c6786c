//! Times as the join keeps them: microseconds since the epoch, and back to text.

use crate::json::{NotMine, R};

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ => {
            if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 {
                29
            } else {
                28
            }
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn digits(b: &[u8], at: usize, n: usize) -> R<i64> {
    let part = b.get(at..at + n).ok_or(NotMine)?;
    let mut v = 0i64;
    for &c in part {
        if !c.is_ascii_digit() {
            return Err(NotMine);
        }
        v = v * 10 + (c - b'0') as i64;
    }
    Ok(v)
}

/// ``occurred_at`` in microseconds since the epoch, for the forms the native core reads:
/// ``YYYY-MM-DDTHH:MM:SS``, an optional fraction of 1 to 9 digits (cut to 6, as
/// ``parse_rfc3339`` does), then ``Z`` or ``+HH:MM`` / ``-HH:MM``. Years outside 1900..=9000
/// and any other form go to the Python path.
pub fn parse_micros(text: &str) -> R<i64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':'
    {
        return Err(NotMine);
    }
    let (year, month, day) = (digits(b, 0, 4)?, digits(b, 5, 2)?, digits(b, 8, 2)?);
    let (hour, minute, second) = (digits(b, 11, 2)?, digits(b, 14, 2)?, digits(b, 17, 2)?);
    if !(1900..=9000).contains(&year)
        || !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return Err(NotMine);
    }
    let mut at = 19;
    let mut fraction = 0i64;
    if b[at] == b'.' {
        at += 1;
        let start = at;
        while at < b.len() && b[at].is_ascii_digit() {
            at += 1;
        }
        let n = at - start;
        if !(1..=9).contains(&n) {
            return Err(NotMine);
        }
        for k in 0..6 {
            fraction = fraction * 10 + if k < n { (b[start + k] - b'0') as i64 } else { 0 };
        }
    }
    let offset_s = match &b[at..] {
        [b'Z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (h, m) = (digits(b, at + 1, 2)?, digits(b, at + 4, 2)?);
            if h > 23 || m > 59 {
                return Err(NotMine);
            }
            let s = h * 3600 + m * 60;
            if *sign == b'-' {
                -s
            } else {
                s
            }
        }
        _ => return Err(NotMine),
    };
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
        - offset_s;
    Ok(seconds * 1_000_000 + fraction)
}

/// ``rl_export.model.events.format_micros``: ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``.
pub fn format_micros(out: &mut Vec<u8>, value: i64) {
    let seconds = value.div_euclid(1_000_000);
    let fraction = value.rem_euclid(1_000_000);
    let days = seconds.div_euclid(86_400);
    let rest = seconds.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let two = |out: &mut Vec<u8>, v: i64| {
        out.push(b'0' + (v / 10) as u8);
        out.push(b'0' + (v % 10) as u8);
    };
    out.push(b'0' + (y / 1000 % 10) as u8);
    out.push(b'0' + (y / 100 % 10) as u8);
    two(out, y % 100);
    out.push(b'-');
    two(out, m);
    out.push(b'-');
    two(out, d);
    out.push(b'T');
    two(out, rest / 3600);
    out.push(b':');
    two(out, rest / 60 % 60);
    out.push(b':');
    two(out, rest % 60);
    if fraction != 0 {
        out.push(b'.');
        let mut f = fraction;
        let mut buf = [b'0'; 6];
        for k in (0..6).rev() {
            buf[k] = b'0' + (f % 10) as u8;
            f /= 10;
        }
        out.extend_from_slice(&buf);
    }
    out.push(b'Z');
}

pub fn format_micros_string(value: i64) -> String {
    let mut out = Vec::with_capacity(27);
    format_micros(&mut out, value);
    String::from_utf8(out).unwrap()
}
