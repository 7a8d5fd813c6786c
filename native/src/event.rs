//! An input event decoded and checked as `rl_export.model.eventview.read_event` does, for
//! the events whose every field the native core knows.
//!
//! The rule that keeps this exact (the models of `rl_export.model.events` are the contract):
//! an event is decoded here only when each of its keys, at the top and in the rubric, is one
//! this decoder reads, every check passes, and every value is one it writes back as the
//! Python side does. Anything else (a key it does not know, a field of another rubric
//! version, a rejection of any kind, an unusual number or string) is [`NotMine`]: the Python
//! path decodes it, rejects it with its reason, or accepts it. A key the models gain later
//! is therefore the Python path's until this decoder learns it.

use std::borrow::Cow;

use crate::json::{write_f64, write_str, write_val, NotMine, Num, Obj, Reader, Val, R};
use crate::time::{format_micros, format_micros_string, parse_micros};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    TraceCompleted,
    TraceDeleted,
    EvaluationFinished,
    LabelSubmitted,
    LabelSkipped,
    LabelRetracted,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::TraceCompleted => "trace.completed",
            Kind::TraceDeleted => "trace.deleted",
            Kind::EvaluationFinished => "evaluation.finished",
            Kind::LabelSubmitted => "label.submitted",
            Kind::LabelSkipped => "label.skipped",
            Kind::LabelRetracted => "label.retracted",
        }
    }

    fn of(name: &str) -> R<Kind> {
        Ok(match name {
            "trace.completed" => Kind::TraceCompleted,
            "trace.deleted" => Kind::TraceDeleted,
            "evaluation.finished" => Kind::EvaluationFinished,
            "label.submitted" => Kind::LabelSubmitted,
            "label.skipped" => Kind::LabelSkipped,
            "label.retracted" => Kind::LabelRetracted,
            _ => return Err(NotMine),
        })
    }

    /// The topic family (`rl_export.model.events.FAMILY_OF_TYPE`): 1 traces, 2 evaluations,
    /// 3 labels.
    pub fn family(self) -> u8 {
        match self {
            Kind::TraceCompleted | Kind::TraceDeleted => 1,
            Kind::EvaluationFinished => 2,
            _ => 3,
        }
    }

    /// Every key an event of this type may have here (the models' fields, nothing else).
    fn keys(self) -> &'static [&'static str] {
        match self {
            Kind::TraceCompleted => {
                &["agent_version", "scenario", "messages", "spans", "metadata", "attachments"]
            }
            Kind::TraceDeleted => &[],
            Kind::EvaluationFinished => &["evaluation_id", "results", "report"],
            Kind::LabelSubmitted => &["labeler", "rubric", "comment"],
            Kind::LabelSkipped | Kind::LabelRetracted => &["labeler"],
        }
    }
}

const BASE_KEYS: [&str; 6] = ["event_id", "event_type", "occurred_at", "org", "project", "trace_id"];
const RUBRIC: [&str; 4] = ["correctness", "helpfulness", "efficiency", "safety"];

/// What the state keeps of a `trace.completed`, already as it keeps it.
#[derive(Clone, Debug)]
pub struct TracePayload {
    pub agent_version: String,
    pub scenario: String,
    pub messages: Vec<u8>,    // orjson.dumps(orjson.loads(messages))
    pub attachments: Vec<u8>, // codec.dumps(attachments as the model dumps them)
    pub metadata: Vec<u8>,    // orjson.dumps(orjson.loads(metadata)), b"{}" when absent
}

/// What the state keeps of an `evaluation.finished` (`rl_export.stream.join.evaluation_view`).
#[derive(Clone, Debug)]
pub struct EvaluationPayload {
    pub evaluation_id: String,
    pub view: Vec<u8>,
    pub scores: Option<Vec<u8>>,
    pub reward: Option<f64>,
    pub passed: Option<bool>,
}

#[derive(Clone, Debug)]
pub enum Payload {
    None,
    Trace(TracePayload),
    Evaluation(EvaluationPayload),
    Label { labeler: String, rubric: Option<[i64; 4]>, comment: Option<String> },
}

#[derive(Clone, Debug)]
pub struct Event {
    pub kind: Kind,
    pub event_id: String,
    pub micros: i64,
    pub org: String,
    pub project: String,
    pub trace_id: String,
    pub payload: Payload,
}

/// Where an event must have come from, and when, to be accepted (`placement_rejection`).
pub struct Placement<'k> {
    pub max_bytes: usize,
    pub family: u8, // 0: any topic
    pub key: Option<&'k [u8]>,
    pub now_us: i64,
    pub tolerance_s: f64,
}

/// True when the bytes hold 19 ASCII digits in a row (`events.long_digit_run`).
fn long_digit_run(raw: &[u8]) -> bool {
    let mut run = 0;
    for &c in raw {
        if c.is_ascii_digit() {
            run += 1;
            if run >= 19 {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

/// Decode and check one Kafka value as `read_event` does: the event, or NotMine (the Python
/// path then accepts or rejects it).
pub fn decode(raw: &[u8], placement: &Placement<'_>) -> R<Event> {
    if raw.len() > placement.max_bytes {
        return Err(NotMine);
    }
    let event = decode_schema(raw)?;
    if placement.family != 0 && event.kind.family() != placement.family {
        return Err(NotMine);
    }
    if let Some(key) = placement.key {
        if key != event.trace_id.as_bytes() {
            return Err(NotMine);
        }
    }
    // (occurred_at - now).total_seconds() > tolerance: exact while the difference fits 2^53 µs.
    let ahead = event.micros.checked_sub(placement.now_us).ok_or(NotMine)?;
    if ahead.unsigned_abs() >= 1 << 53 || (ahead as f64) / 1e6 > placement.tolerance_s {
        return Err(NotMine);
    }
    Ok(event)
}

fn text(v: &Val<'_>) -> R<String> {
    match v {
        Val::Str(s) => Ok(s.to_string()),
        _ => Err(NotMine),
    }
}

fn non_empty(v: &Val<'_>) -> R<String> {
    match v {
        Val::Str(s) if !s.is_empty() => Ok(s.to_string()),
        _ => Err(NotMine),
    }
}

/// Decode an event's schema only (`reread_event`, for an event that waited for its trace).
pub fn decode_schema(raw: &[u8]) -> R<Event> {
    let text_ok = std::str::from_utf8(raw).is_ok();
    if !text_ok || long_digit_run(raw) {
        return Err(NotMine);
    }
    // The top level: each key once, where its value starts.
    let mut r = Reader::new(raw);
    r.expect(b'{')?;
    let mut fields: Vec<(Cow<'_, str>, usize)> = Vec::with_capacity(12);
    let mut conversation: Option<Vec<u8>> = None; // copied in this pass: most of the bytes
    let mut first = true;
    while let Some(key) = r.key(&mut first)? {
        if fields.iter().any(|(k, _)| *k == key) {
            return Err(NotMine);
        }
        r.ws();
        fields.push((key, r.i));
        if fields.last().unwrap().0 == "messages" {
            conversation = Some(messages(&mut r)?);
        } else {
            r.skip(1)?;
        }
    }
    r.end()?;
    let at = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, at)| *at);
    let value = |name: &str| -> R<Option<Val<'_>>> {
        match at(name) {
            Some(start) => Ok(Some(Reader::at(raw, start).value(1)?)),
            None => Ok(None),
        }
    };
    let required = |name: &str| -> R<Val<'_>> { value(name)?.ok_or(NotMine) };
    let kind = Kind::of(&text(&required("event_type")?)?)?;
    let allowed = kind.keys();
    if !fields.iter().all(|(k, _)| BASE_KEYS.contains(&k.as_ref()) || allowed.contains(&k.as_ref()))
    {
        return Err(NotMine);
    }
    let event_id = non_empty(&required("event_id")?)?;
    let micros = parse_micros(&text(&required("occurred_at")?)?)?;
    let org = non_empty(&required("org")?)?;
    let project = non_empty(&required("project")?)?;
    let trace_id = non_empty(&required("trace_id")?)?;
    let payload = match kind {
        Kind::TraceDeleted => Payload::None,
        Kind::LabelSkipped | Kind::LabelRetracted => {
            Payload::Label { labeler: non_empty(&required("labeler")?)?, rubric: None, comment: None }
        }
        Kind::LabelSubmitted => {
            let labeler = non_empty(&required("labeler")?)?;
            let rubric = rubric(&required("rubric")?)?;
            let comment = match value("comment")? {
                None | Some(Val::Null) => None,
                Some(Val::Str(s)) => Some(s.to_string()),
                Some(_) => return Err(NotMine),
            };
            Payload::Label { labeler, rubric: Some(rubric), comment }
        }
        Kind::TraceCompleted => {
            Payload::Trace(trace(raw, &at, &required, conversation.ok_or(NotMine)?)?)
        }
        Kind::EvaluationFinished => {
            let evaluation_id = non_empty(&required("evaluation_id")?)?;
            let results = required("results")?;
            let report = value("report")?;
            Payload::Evaluation(evaluation(evaluation_id, micros, &results, report.as_ref())?)
        }
    };
    Ok(Event { kind, event_id, micros, org, project, trace_id, payload })
}

fn rubric(v: &Val<'_>) -> R<[i64; 4]> {
    let Val::Obj(items) = v else { return Err(NotMine) };
    if items.len() != 4 {
        return Err(NotMine); // forbid unknown fields, all four required (keys are unique)
    }
    let mut out = [0i64; 4];
    for (n, name) in RUBRIC.iter().enumerate() {
        match v.get(name) {
            Some(Val::Num(Num::Int(r))) if (1..=5).contains(r) => out[n] = *r,
            _ => return Err(NotMine),
        }
    }
    Ok(out)
}

fn trace<'a>(
    raw: &'a [u8],
    at: &dyn Fn(&str) -> Option<usize>,
    required: &dyn Fn(&str) -> R<Val<'a>>,
    messages: Vec<u8>,
) -> R<TracePayload> {
    let agent_version = text(&required("agent_version")?)?;
    let scenario = text(&required("scenario")?)?;
    if let Some(start) = at("spans") {
        if !matches!(raw[start], b'[' | b'n') {
            return Err(NotMine); // a list or null (the skip checked the rest)
        }
    }
    let metadata = match at("metadata") {
        None => b"{}".to_vec(),
        Some(start) => {
            if raw[start] != b'{' {
                return Err(NotMine); // an object; null is not allowed
            }
            let mut out = Vec::with_capacity(64);
            Reader::at(raw, start).copy(&mut out, 1)?;
            out
        }
    };
    let mut attachments = Vec::with_capacity(2);
    attachments.push(b'[');
    if let Some(start) = at("attachments") {
        let Val::Arr(items) = Reader::at(raw, start).value(1)? else { return Err(NotMine) };
        for (n, item) in items.iter().enumerate() {
            if n > 0 {
                attachments.push(b',');
            }
            attachment(&mut attachments, item)?;
        }
    }
    attachments.push(b']');
    Ok(TracePayload { agent_version, scenario, messages, attachments, metadata })
}

/// The conversation (the reader is at it), checked as `_Message` checks each message,
/// copied as orjson writes it.
fn messages(r: &mut Reader<'_>) -> R<Vec<u8>> {
    let mut out = Vec::with_capacity(r.b.len() - r.i);
    r.expect(b'[')?;
    out.push(b'[');
    let mut first = true;
    while r.item(&mut first)? {
        if out.len() > 1 {
            out.push(b',');
        }
        r.expect(b'{')?;
        out.push(b'{');
        let mut keys: Vec<Cow<'_, str>> = Vec::with_capacity(6);
        let mut role = false;
        let mut first_key = true;
        while let Some(key) = r.key(&mut first_key)? {
            if keys.contains(&key) {
                return Err(NotMine);
            }
            let next = r.peek()?;
            let ok = match key.as_ref() {
                "role" => {
                    let start = r.i;
                    let value = r.string()?;
                    r.i = start;
                    role = matches!(value.as_ref(), "system" | "user" | "assistant" | "tool");
                    role
                }
                "content" => matches!(next, b'"' | b'[' | b'n'),
                "name" | "tool_call_id" => matches!(next, b'"' | b'n'),
                "tool_calls" => matches!(next, b'[' | b'n'),
                _ => true,
            };
            if !ok {
                return Err(NotMine);
            }
            if !keys.is_empty() {
                out.push(b',');
            }
            write_str(&mut out, &key, false);
            out.push(b':');
            keys.push(key);
            r.copy(&mut out, 3)?; // `null` for a literal that is not null fails there
        }
        if !role {
            return Err(NotMine);
        }
        out.push(b'}');
    }
    out.push(b']');
    Ok(out)
}

/// Write `obj` as its model dumps it: the declared keys present, in declared order, then the
/// others in their order (`eventview._dump` without a fill).
fn dump_declared(out: &mut Vec<u8>, items: &[(Cow<'_, str>, Val<'_>)], declared: &[&str]) {
    let mut o = Obj::new(out, true);
    for name in declared {
        if let Some((k, v)) = items.iter().find(|(k, _)| k == name) {
            write_val(o.key(k), v, true);
        }
    }
    for (k, v) in items {
        if !declared.contains(&k.as_ref()) {
            write_val(o.key(k), v, true);
        }
    }
    o.close();
}

fn attachment(out: &mut Vec<u8>, v: &Val<'_>) -> R<()> {
    let Val::Obj(items) = v else { return Err(NotMine) };
    non_empty(v.get("name").ok_or(NotMine)?)?;
    non_empty(v.get("uri").ok_or(NotMine)?)?;
    text(v.get("content_type").ok_or(NotMine)?)?;
    match v.get("size") {
        Some(Val::Num(Num::Int(size))) if *size >= 0 => {}
        _ => return Err(NotMine),
    }
    dump_declared(out, items, &["name", "uri", "content_type", "size"]);
    Ok(())
}

struct Scored<'s> {
    evaluator: &'s str,
    score: f64,
    passed: bool,
}

fn evaluation(
    evaluation_id: String,
    micros: i64,
    results: &Val<'_>,
    report: Option<&Val<'_>>,
) -> R<EvaluationPayload> {
    let Val::Arr(results) = results else { return Err(NotMine) };
    let mut view = Vec::with_capacity(256);
    let mut o = Obj::new(&mut view, true);
    write_str(o.key("evaluation_id"), &evaluation_id, true);
    let at = o.key("occurred_at");
    at.push(b'"');
    format_micros(at, micros);
    at.push(b'"');
    let out = o.key("results");
    out.push(b'[');
    let mut scored: Vec<Scored<'_>> = Vec::with_capacity(results.len());
    for (n, result) in results.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        scored.push(self::result(out, result)?);
    }
    out.push(b']');
    let out = o.key("report");
    match report {
        None => out.extend_from_slice(b"{\"outcomes\":[],\"classifications\":[]}"),
        Some(report) => self::report(out, report)?,
    }
    o.close();
    // `evaluator_reward`: summed in (evaluator, score) order; scores keep the last of each.
    if scored.is_empty() {
        return Ok(EvaluationPayload { evaluation_id, view, scores: None, reward: None, passed: None });
    }
    scored.sort_by(|a, b| {
        a.evaluator.cmp(b.evaluator).then(a.score.partial_cmp(&b.score).unwrap())
    });
    let mut total = 0.0;
    for s in &scored {
        total += s.score;
    }
    let reward = total / scored.len() as f64;
    let passed = scored.iter().all(|s| s.passed);
    let mut scores = Vec::with_capacity(64);
    let mut o = Obj::new(&mut scores, true);
    for (n, s) in scored.iter().enumerate() {
        if n + 1 < scored.len() && scored[n + 1].evaluator == s.evaluator {
            continue; // a later one of the same evaluator wins
        }
        write_f64(o.key(s.evaluator), s.score);
    }
    o.close();
    Ok(EvaluationPayload { evaluation_id, view, scores: Some(scores), reward: Some(reward), passed: Some(passed) })
}

/// One result as `eventview._result` dumps it (a JSON integer score becomes a float).
fn result<'s>(out: &mut Vec<u8>, v: &'s Val<'_>) -> R<Scored<'s>> {
    let Val::Obj(items) = v else { return Err(NotMine) };
    let evaluator = match v.get("evaluator") {
        Some(Val::Str(s)) if !s.is_empty() => s.as_ref(),
        _ => return Err(NotMine),
    };
    let score = match v.get("score") {
        Some(Val::Num(Num::Int(0))) => 0.0,
        Some(Val::Num(Num::Int(1))) => 1.0,
        Some(Val::Num(Num::Float(f))) if (0.0..=1.0).contains(f) => *f,
        _ => return Err(NotMine),
    };
    let passed = match v.get("passed") {
        Some(Val::Bool(b)) => *b,
        _ => return Err(NotMine),
    };
    if !matches!(v.get("reasoning"), None | Some(Val::Null) | Some(Val::Str(_))) {
        return Err(NotMine);
    }
    let declared = ["evaluator", "score", "passed", "reasoning"];
    let mut o = Obj::new(out, true);
    for name in declared {
        if let Some((k, value)) = items.iter().find(|(k, _)| k == name) {
            let to = o.key(k);
            if name == "score" {
                write_f64(to, score);
            } else {
                write_val(to, value, true);
            }
        }
    }
    for (k, value) in items {
        if !declared.contains(&k.as_ref()) {
            write_val(o.key(k), value, true);
        }
    }
    o.close();
    Ok(Scored { evaluator, score, passed })
}

/// Writes one declared member's value: (name, value, where to), or NotMine.
type Each<'e> = dyn FnMut(&str, &Val<'_>, &mut Vec<u8>) -> R<()> + 'e;

/// A nested object as its model dumps it with defaults (`eventview._dump` with a fill):
/// every declared key in order (`fill` writes the missing ones), then the others.
fn dump_filled(
    out: &mut Vec<u8>,
    items: &[(Cow<'_, str>, Val<'_>)],
    declared: &[(&str, &[u8])],
    each: &mut Each<'_>,
) -> R<()> {
    let mut o = Obj::new(out, true);
    for (name, fill) in declared {
        let to = o.key(name);
        match items.iter().find(|(k, _)| k == name) {
            Some((_, v)) => each(name, v, to)?,
            None => to.extend_from_slice(fill),
        }
    }
    for (k, v) in items {
        if !declared.iter().any(|(name, _)| name == k) {
            write_val(o.key(k), v, true);
        }
    }
    o.close();
    Ok(())
}

fn is_str(v: &Val<'_>) -> bool {
    matches!(v, Val::Str(_))
}

fn int_or_null(v: &Val<'_>) -> bool {
    matches!(v, Val::Null | Val::Num(Num::Int(_)))
}

fn list_of(
    out: &mut Vec<u8>,
    v: &Val<'_>,
    each: fn(&mut Vec<u8>, &Val<'_>) -> R<()>,
) -> R<()> {
    let Val::Arr(items) = v else { return Err(NotMine) };
    out.push(b'[');
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        each(out, item)?;
    }
    out.push(b']');
    Ok(())
}

fn report(out: &mut Vec<u8>, v: &Val<'_>) -> R<()> {
    let Val::Obj(items) = v else { return Err(NotMine) };
    dump_filled(out, items, &[("outcomes", b"[]"), ("classifications", b"[]")], &mut |name, v, to| {
        list_of(to, v, if name == "outcomes" { outcome } else { classification })
    })
}

fn outcome(out: &mut Vec<u8>, v: &Val<'_>) -> R<()> {
    let Val::Obj(items) = v else { return Err(NotMine) };
    if !v.get("type").is_some_and(is_str) {
        return Err(NotMine);
    }
    let declared: [(&str, &[u8]); 4] =
        [("type", b""), ("turn", b"null"), ("decision", b"null"), ("severity", b"0")];
    dump_filled(out, items, &declared, &mut |name, v, to| {
        let ok = match name {
            "turn" => int_or_null(v),
            "decision" => matches!(v, Val::Null | Val::Bool(_)),
            "severity" => matches!(v, Val::Num(Num::Int(s)) if *s >= 0),
            _ => true, // type: checked above
        };
        if !ok {
            return Err(NotMine);
        }
        write_val(to, v, true);
        Ok(())
    })
}

fn classification(out: &mut Vec<u8>, v: &Val<'_>) -> R<()> {
    let Val::Obj(items) = v else { return Err(NotMine) };
    if !v.get("type").is_some_and(is_str) {
        return Err(NotMine);
    }
    let declared: [(&str, &[u8]); 3] = [("type", b""), ("turn", b"null"), ("assessments", b"[]")];
    dump_filled(out, items, &declared, &mut |name, v, to| match name {
        "turn" if !int_or_null(v) => Err(NotMine),
        "assessments" => list_of(to, v, assessment),
        _ => {
            write_val(to, v, true);
            Ok(())
        }
    })
}

fn assessment(out: &mut Vec<u8>, v: &Val<'_>) -> R<()> {
    let Val::Obj(items) = v else { return Err(NotMine) };
    if !v.get("principle_id").is_some_and(is_str) {
        return Err(NotMine);
    }
    let declared: [(&str, &[u8]); 3] =
        [("principle_id", b""), ("decision", b"null"), ("explanation", b"null")];
    dump_filled(out, items, &declared, &mut |name, v, to| {
        let ok = match name {
            "decision" => matches!(v, Val::Null | Val::Bool(_) | Val::Str(_)),
            "explanation" => matches!(v, Val::Null | Val::Str(_)),
            _ => true,
        };
        if !ok {
            return Err(NotMine);
        }
        write_val(to, v, true);
        Ok(())
    })
}

/// `completed_at` of a trace view: `format_micros` of its time.
pub fn completed_at(micros: i64) -> String {
    format_micros_string(micros)
}
