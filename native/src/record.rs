//! The sink's read of a snapshot in the record layout
//! (`rl_export.model.records.SnapshotLines.from_record`): the small parts of the value its
//! `rl-export-record-at` header points at, checked as the Python method checks them.
//!
//! Only what the join writes is read here (plain offsets, a head of the three identity
//! strings, a tail of `human`, `evaluator` and `deleted: false`); anything else is
//! [`NotMine`] and the Python method reads it (and may refuse it).

use crate::json::{NotMine, Num, Reader, Val, R};

const SOURCE: &[u8] = b",\"reward_source\":";
const REVISION: &[u8] = b",\"revision\":";
const REWARD_NULL: &[u8] = b",\"reward\":null";
const REWARD: &[u8] = b",\"reward\":";
const UPDATED_AT: &[u8] = b",\"updated_at\":\"";
const TAIL: &[u8] = b",\"human\":";
const MESSAGES: &[u8] = b",\"messages\":";
const HUMAN_LABELS: &[u8] = b",\"human_labels\":[";

/// `{"reward": <float>, "passed": <bool>}` or null: a source's reward as the join writes it.
pub type Reward = Option<(f64, bool)>;

pub struct Record {
    pub trace_id: String,
    pub org: String,
    pub project: String,
    pub revision: i64,
    pub human: Reward,
    pub evaluator: Reward,
    pub updated_at: String,
    pub at: [usize; 4],
    pub messages_at: Option<(usize, usize)>,
}

fn plain_int(text: &[u8]) -> R<i64> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(NotMine);
    }
    std::str::from_utf8(text).map_err(|_| NotMine)?.parse().map_err(|_| NotMine)
}

fn starts(value: &[u8], at: usize, with: &[u8]) -> bool {
    value.get(at..).is_some_and(|rest| rest.starts_with(with))
}

fn find(value: &[u8], what: &[u8], from: usize, to: usize) -> Option<usize> {
    let hay = value.get(from..to.min(value.len()))?;
    hay.windows(what.len()).position(|w| w == what).map(|at| from + at)
}

fn reward(v: Option<&Val<'_>>) -> R<Reward> {
    match v {
        Some(Val::Null) => Ok(None),
        Some(Val::Obj(items)) if items.len() == 2 => {
            match (v.unwrap().get("reward"), v.unwrap().get("passed")) {
                (Some(Val::Num(Num::Float(r))), Some(Val::Bool(p))) => Ok(Some((*r, *p))),
                _ => Err(NotMine),
            }
        }
        _ => Err(NotMine),
    }
}

pub fn read(value: &[u8], header: &[u8]) -> R<Record> {
    let mut numbers = Vec::with_capacity(6);
    for part in header.split(|&c| c == b',') {
        let n = plain_int(part)?;
        numbers.push(usize::try_from(n).map_err(|_| NotMine)?);
    }
    let (a, b, c, d) = match numbers[..] {
        [a, b, c, d] | [a, b, c, d, _, _] => (a, b, c, d),
        _ => return Err(NotMine),
    };
    let messages_at = match numbers[..] {
        [_, _, _, _, e, f] => {
            if !(c < e && e <= f && f <= d && e >= MESSAGES.len() && starts(value, e - MESSAGES.len(), MESSAGES)) {
                return Err(NotMine);
            }
            Some((e, f))
        }
        _ => None,
    };
    if find(value, HUMAN_LABELS, c, d).is_none() {
        return Err(NotMine); // no human_labels (schema 2's labels, maybe): the Python way
    }
    if a < SOURCE.len()
        || b < REWARD.len()
        || !starts(value, a, b"null")
        || !starts(value, c, b"null")
        || !starts(value, b - REWARD.len(), REWARD_NULL)
        || !starts(value, a + 4, REVISION)
        || !starts(value, d, TAIL)
        || value.last() != Some(&b'}')
        || &value[a - SOURCE.len()..a] != SOURCE
    {
        return Err(NotMine);
    }
    let revision = plain_int(value.get(a + 4 + REVISION.len()..b - REWARD.len()).ok_or(NotMine)?)?;
    let head_end = a - SOURCE.len();
    let head = &value[..head_end];
    if std::str::from_utf8(head).is_err() {
        return Err(NotMine);
    }
    let mut r = Reader::new(head);
    r.expect(b'{')?;
    let mut identity: [Option<String>; 3] = [None, None, None];
    let mut first = true;
    while let Some(key) = r.key(&mut first)? {
        let slot = match key.as_ref() {
            "trace_id" => 0,
            "org" => 1,
            "project" => 2,
            _ => return Err(NotMine),
        };
        if identity[slot].is_some() {
            return Err(NotMine);
        }
        identity[slot] = Some(r.string()?.into_owned());
        if r.i == head.len() {
            break; // the head ends where `,"reward_source":` begins
        }
    }
    if r.i != head.len() {
        return Err(NotMine);
    }
    let [Some(trace_id), Some(org), Some(project)] = identity else { return Err(NotMine) };
    let tail = &value[d + 1..];
    if std::str::from_utf8(tail).is_err() {
        return Err(NotMine);
    }
    let mut opened = Vec::with_capacity(tail.len() + 1);
    opened.push(b'{');
    opened.extend_from_slice(tail);
    let mut r = Reader::new(&opened);
    let parsed = r.value(0)?;
    r.end()?;
    let Val::Obj(items) = &parsed else { return Err(NotMine) };
    if items.len() != 3 || !matches!(parsed.get("deleted"), Some(Val::Bool(false))) {
        return Err(NotMine);
    }
    let human = reward(parsed.get("human"))?;
    let evaluator = reward(parsed.get("evaluator"))?;
    let start = (0..d.saturating_sub(UPDATED_AT.len() - 1))
        .rev()
        .find(|&at| value[at..].starts_with(UPDATED_AT))
        .ok_or(NotMine)?
        + UPDATED_AT.len();
    let end = start + value[start..].iter().position(|&ch| ch == b'"').ok_or(NotMine)?;
    let updated_at = std::str::from_utf8(&value[start..end]).map_err(|_| NotMine)?.to_string();
    Ok(Record {
        trace_id,
        org,
        project,
        revision,
        human,
        evaluator,
        updated_at,
        at: [a, b, c, d],
        messages_at,
    })
}
