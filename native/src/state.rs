//! A trace's state, its bytes in the join's table (`rl_export.stream.state`, version 3), the
//! join rules that change it (`rl_export.stream.join`) and the snapshot it emits
//! (`rl_export.model.records.encode_snapshot`).
//!
//! A state is loaded here only when its bytes are exactly of the shape this core writes:
//! version 3, a head of the fourteen items it knows, each of the type it writes, every label,
//! trace, evaluation and pending item of the lengths it knows. A state that holds anything
//! else (a field a later version of the Python rules keeps) is [`NotMine`], and the Python
//! path handles its trace.

use std::collections::{BTreeMap, BTreeSet};

use crate::event::{completed_at, decode_schema, Event, Kind, Payload};
use crate::json::{
    write_f64, write_i64, write_num, write_opt_bool, write_opt_f64, write_raw, write_repr,
    write_str, NotMine,
    Num, Obj, Reader, Val, R,
};
use crate::time::format_micros;

/// The revision of every tombstone (`records.ERASED_REVISION`): greater than any record's, so
/// a deletion hides the trace on every chain, a replay's or another run's included.
pub const ERASED_REVISION: i64 = 1 << 62;

#[derive(Clone, Debug)]
pub struct Pending {
    pub event_id: String,
    pub value: Vec<u8>,
    pub topic: String,
    pub partition: i64,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
}

#[derive(Clone, Debug)]
pub struct Trace {
    pub micros: i64,
    pub eid: String,
    pub agent_version: String,
    pub scenario: String,
    pub completed_at: String,
    pub messages: Vec<u8>,
    pub attachments: Vec<u8>,
    pub metadata: Option<Vec<u8>>,
}

#[derive(Clone, Debug)]
pub struct Evaluation {
    pub micros: i64,
    pub eid: String,
    pub evaluation_id: String,
    pub view: Vec<u8>,
    pub scores: Option<Vec<u8>>,
    pub reward: Option<f64>,
    pub passed: Option<bool>,
}

#[derive(Clone, Debug)]
pub struct Label {
    pub micros: i64,
    pub eid: String,
    pub rubric: Option<[i64; 4]>,
    pub comment: Option<String>,
}

#[derive(Clone, Debug)]
pub struct State {
    pub trace_id: String,
    pub org: Option<String>,
    pub project: Option<String>,
    pub seen: BTreeSet<String>,
    pub pending: Vec<Pending>,
    pub first_pending_at: Option<Num>,
    pub trace: Option<Trace>,
    pub evaluation: Option<Evaluation>,
    pub labels: BTreeMap<String, Label>,
    pub skipped_by: BTreeSet<String>,
    pub updated_at: i64,
    pub deleted_at: Option<Num>,
    pub deleted_revision: i64,
}

/// What merging one event did (`MergeResult.outcome`, and whether a snapshot is due).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    Duplicate,
    Pending,
    Ignored,
}

/// Where an event that waits came from (`rl_export.stream.join.RawEvent`).
pub struct Origin {
    pub value: Vec<u8>,
    pub topic: String,
    pub partition: i64,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
}

fn key_gt(a: (i64, &str), b: (i64, &str)) -> bool {
    a > b
}

impl State {
    pub fn new(trace_id: &str) -> State {
        State {
            trace_id: trace_id.to_string(),
            org: None,
            project: None,
            seen: BTreeSet::new(),
            pending: Vec::new(),
            first_pending_at: None,
            trace: None,
            evaluation: None,
            labels: BTreeMap::new(),
            skipped_by: BTreeSet::new(),
            updated_at: 0,
            deleted_at: None,
            deleted_revision: 0,
        }
    }

    pub fn revision(&self) -> i64 {
        self.seen.len() as i64
    }

    pub fn deleted(&self) -> bool {
        self.deleted_at.is_some()
    }

    pub fn is_orphan(&self) -> bool {
        self.trace.is_none() && !self.deleted()
    }

    /// The expiry index's entry (`processor.expiry_mark`): `tombstone <deleted_at>` or
    /// `orphan <first_pending_at>`, the time as Python's `repr` writes it; None: no entry.
    pub fn mark(&self) -> Option<Vec<u8>> {
        let (kind, at): (&[u8], Num) = match (self.deleted_at, self.first_pending_at) {
            (Some(at), _) => (b"tombstone ", at),
            (None, Some(at)) if self.is_orphan() => (b"orphan ", at),
            _ => return None,
        };
        let mut out = kind.to_vec();
        match at {
            Num::Int(i) => write_i64(&mut out, i),
            Num::Float(f) => write_repr(&mut out, f),
        }
        Some(out)
    }

    // --- the rules (`join._merge`) ------------------------------------------------------------

    /// Merge one event; NotMine leaves the state as it was (the Python path then merges it):
    /// an event the rules reject (another org), or a waiting event this core cannot read.
    pub fn merge(
        &mut self,
        event: &Event,
        now: Num,
        origin: &mut dyn FnMut() -> R<Origin>,
    ) -> R<(Outcome, bool)> {
        let id = &event.event_id;
        if self.seen.contains(id) || self.pending.iter().any(|p| &p.event_id == id) {
            let emits =
                self.trace.is_some() || self.deleted() || self.waiting_deletion()?.is_some();
            return Ok((Outcome::Duplicate, emits));
        }
        if self.trace.is_none() && !self.deleted() {
            if event.kind != Kind::TraceCompleted {
                let o = origin()?;
                self.pending.push(Pending {
                    event_id: id.clone(),
                    value: o.value,
                    topic: o.topic,
                    partition: o.partition,
                    offset: o.offset,
                    timestamp_ms: o.timestamp_ms,
                });
                if self.first_pending_at.is_none() {
                    self.first_pending_at = Some(now);
                }
                // A deletion does not wait in silence: its tombstone goes out now (the
                // snapshot of a trace that has not come: the Python path encodes it).
                return Ok((Outcome::Pending, event.kind == Kind::TraceDeleted));
            }
            return self.arrive(event, now);
        }
        if self.org.as_deref() != Some(event.org.as_str())
            || self.project.as_deref() != Some(event.project.as_str())
        {
            return Err(NotMine); // rejected: the Python path says so, with its detail
        }
        if self.deleted() {
            self.count(event);
            return Ok((Outcome::Ignored, false));
        }
        self.apply(event, now);
        self.settle_tombstone();
        Ok((Outcome::Accepted, true))
    }

    /// The first `trace.completed` (`join._arrive`); every waiting event is read first, so a
    /// NotMine changes nothing.
    fn arrive(&mut self, trace: &Event, now: Num) -> R<(Outcome, bool)> {
        let mut waiting = Vec::with_capacity(self.pending.len());
        for p in &self.pending {
            let event = decode_schema(&p.value)?;
            if event.org != trace.org || event.project != trace.project {
                return Err(NotMine); // rejected when the trace arrives: the Python path's
            }
            waiting.push(event);
        }
        self.org = Some(trace.org.clone());
        self.project = Some(trace.project.clone());
        self.apply(trace, now);
        self.pending.clear();
        self.first_pending_at = None;
        for event in &waiting {
            if self.deleted() {
                self.count(event);
            } else {
                self.apply(event, now);
            }
        }
        self.settle_tombstone();
        Ok((Outcome::Accepted, true))
    }

    /// The org and project of the latest `trace.deleted` waiting for a trace that has not
    /// come (`join.waiting_deletion`); NotMine when a waiting event does not decode here.
    fn waiting_deletion(&self) -> R<Option<(String, String)>> {
        if self.trace.is_some() || self.deleted() {
            return Ok(None);
        }
        for p in self.pending.iter().rev() {
            let event = decode_schema(&p.value)?;
            if event.kind == Kind::TraceDeleted {
                return Ok(Some((event.org, event.project)));
            }
        }
        Ok(None)
    }

    fn settle_tombstone(&mut self) {
        if self.deleted() && self.deleted_revision == 0 {
            self.deleted_revision = self.revision();
        }
    }

    fn count(&mut self, event: &Event) {
        self.seen.insert(event.event_id.clone());
        self.updated_at = self.updated_at.max(event.micros);
    }

    fn apply(&mut self, event: &Event, now: Num) {
        self.count(event);
        let key = (event.micros, event.event_id.as_str());
        match (&event.kind, &event.payload) {
            (Kind::LabelSubmitted | Kind::LabelRetracted, Payload::Label { labeler, rubric, comment }) => {
                let newer = match self.labels.get(labeler) {
                    None => true,
                    Some(current) => key_gt(key, (current.micros, &current.eid)),
                };
                if newer {
                    self.labels.insert(
                        labeler.clone(),
                        Label {
                            micros: event.micros,
                            eid: event.event_id.clone(),
                            rubric: *rubric,
                            comment: comment.clone(),
                        },
                    );
                }
            }
            (Kind::LabelSkipped, Payload::Label { labeler, .. }) => {
                self.skipped_by.insert(labeler.clone());
            }
            (Kind::TraceCompleted, Payload::Trace(t)) => {
                let newer = match &self.trace {
                    None => true,
                    Some(current) => key_gt(key, (current.micros, &current.eid)),
                };
                if newer {
                    self.trace = Some(Trace {
                        micros: event.micros,
                        eid: event.event_id.clone(),
                        agent_version: t.agent_version.clone(),
                        scenario: t.scenario.clone(),
                        completed_at: completed_at(event.micros),
                        messages: t.messages.clone(),
                        attachments: t.attachments.clone(),
                        metadata: Some(t.metadata.clone()),
                    });
                }
            }
            (Kind::EvaluationFinished, Payload::Evaluation(e)) => {
                let newer = match &self.evaluation {
                    None => true,
                    Some(current) => key_gt(key, (current.micros, &current.eid)),
                };
                if newer {
                    self.evaluation = Some(Evaluation {
                        micros: event.micros,
                        eid: event.event_id.clone(),
                        evaluation_id: e.evaluation_id.clone(),
                        view: e.view.clone(),
                        scores: e.scores.clone(),
                        reward: e.reward,
                        passed: e.passed,
                    });
                }
            }
            (Kind::TraceDeleted, _) => {
                self.deleted_at = Some(now);
                self.trace = None;
                self.evaluation = None;
                self.labels.clear();
                self.skipped_by.clear();
            }
            _ => unreachable!("a decoded event's payload matches its kind"),
        }
    }

    // --- the table's bytes (`state.dump_state_parts`, `state.load_state`) ---------------------

    /// The state without its conversation (version 3), and the conversation (empty: none).
    pub fn dump(&self) -> (Vec<u8>, &[u8]) {
        let mut sizes: Vec<usize> = Vec::new();
        let mut head = Vec::with_capacity(256);
        head.push(b'[');
        write_str(&mut head, &self.trace_id, false);
        head.push(b',');
        opt_str(&mut head, self.org.as_deref());
        head.push(b',');
        opt_str(&mut head, self.project.as_deref());
        head.push(b',');
        str_list(&mut head, self.seen.iter());
        head.push(b',');
        opt_num(&mut head, self.first_pending_at);
        head.push(b',');
        match &self.trace {
            None => head.extend_from_slice(b"null"),
            Some(t) => {
                sizes.push(t.attachments.len());
                head.push(b'[');
                write_i64(&mut head, t.micros);
                head.push(b',');
                write_str(&mut head, &t.eid, false);
                head.push(b',');
                write_str(&mut head, &t.agent_version, false);
                head.push(b',');
                write_str(&mut head, &t.scenario, false);
                head.push(b',');
                write_str(&mut head, &t.completed_at, false);
                if let Some(metadata) = &t.metadata {
                    sizes.push(metadata.len());
                    head.extend_from_slice(b",1");
                }
                head.push(b']');
            }
        }
        head.push(b',');
        match &self.evaluation {
            None => head.extend_from_slice(b"null"),
            Some(e) => {
                sizes.push(e.view.len());
                sizes.push(e.scores.as_ref().map_or(0, |s| s.len()));
                head.push(b'[');
                write_i64(&mut head, e.micros);
                head.push(b',');
                write_str(&mut head, &e.eid, false);
                head.push(b',');
                write_str(&mut head, &e.evaluation_id, false);
                head.push(b',');
                write_opt_f64(&mut head, e.reward);
                head.push(b',');
                write_opt_bool(&mut head, e.passed);
                head.push(b']');
            }
        }
        head.push(b',');
        head.push(b'[');
        for (n, (labeler, label)) in self.labels.iter().enumerate() {
            if n > 0 {
                head.push(b',');
            }
            head.push(b'[');
            write_str(&mut head, labeler, false);
            head.push(b',');
            write_i64(&mut head, label.micros);
            head.push(b',');
            write_str(&mut head, &label.eid, false);
            if let Some(rubric) = label.rubric {
                for r in rubric {
                    head.push(b',');
                    write_i64(&mut head, r);
                }
            }
            if let Some(comment) = &label.comment {
                head.push(b',');
                write_str(&mut head, comment, false);
            }
            head.push(b']');
        }
        head.push(b']');
        head.push(b',');
        str_list(&mut head, self.skipped_by.iter());
        head.push(b',');
        write_i64(&mut head, self.updated_at);
        head.push(b',');
        opt_num(&mut head, self.deleted_at);
        head.push(b',');
        write_i64(&mut head, self.deleted_revision);
        head.push(b',');
        head.push(b'[');
        for (n, p) in self.pending.iter().enumerate() {
            sizes.push(p.value.len());
            if n > 0 {
                head.push(b',');
            }
            head.push(b'[');
            write_str(&mut head, &p.event_id, false);
            head.push(b',');
            write_str(&mut head, &p.topic, false);
            head.push(b',');
            write_i64(&mut head, p.partition);
            head.push(b',');
            write_i64(&mut head, p.offset);
            head.push(b',');
            match p.timestamp_ms {
                Some(t) => write_i64(&mut head, t),
                None => head.extend_from_slice(b"null"),
            }
            head.push(b']');
        }
        head.push(b']');
        head.push(b',');
        head.push(b'[');
        for (n, size) in sizes.iter().enumerate() {
            if n > 0 {
                head.push(b',');
            }
            write_i64(&mut head, *size as i64);
        }
        head.push(b']');
        head.push(b']');
        let total: usize = sizes.iter().sum();
        let mut out = Vec::with_capacity(5 + head.len() + total);
        out.push(3);
        out.extend_from_slice(&(head.len() as u32).to_le_bytes());
        out.extend_from_slice(&head);
        if let Some(t) = &self.trace {
            out.extend_from_slice(&t.attachments);
            if let Some(metadata) = &t.metadata {
                out.extend_from_slice(metadata);
            }
        }
        if let Some(e) = &self.evaluation {
            out.extend_from_slice(&e.view);
            if let Some(scores) = &e.scores {
                out.extend_from_slice(scores);
            }
        }
        for p in &self.pending {
            out.extend_from_slice(&p.value);
        }
        let conversation: &[u8] = match &self.trace {
            Some(t) => &t.messages,
            None => b"",
        };
        (out, conversation)
    }

    /// A state of exactly the shape [`State::dump`] writes; the conversation inline (what
    /// follows the segments) or, when that is empty, set later.
    pub fn load(data: &[u8]) -> R<State> {
        if data.first() != Some(&3) || data.len() < 5 {
            return Err(NotMine);
        }
        let length = u32::from_le_bytes([data[1], data[2], data[3], data[4]]) as usize;
        let end = 5usize.checked_add(length).ok_or(NotMine)?;
        let head_bytes = data.get(5..end).ok_or(NotMine)?;
        if std::str::from_utf8(head_bytes).is_err() {
            return Err(NotMine);
        }
        let mut r = Reader::new(head_bytes);
        let head = r.value(0)?;
        r.end()?;
        let Val::Arr(items) = head else { return Err(NotMine) };
        let [trace_id, org, project, seen, first_pending_at, trace_head, evaluation_head, labels, skipped_by, updated_at, deleted_at, deleted_revision, pending_heads, sizes] =
            <[Val<'_>; 14]>::try_from(items).map_err(|_| NotMine)?;
        let mut segments: Vec<&[u8]> = Vec::new();
        let mut at = end;
        for size in arr(&sizes)? {
            let size = usize::try_from(int(size)?).map_err(|_| NotMine)?;
            let stop = at.checked_add(size).ok_or(NotMine)?;
            segments.push(data.get(at..stop).ok_or(NotMine)?);
            at = stop;
        }
        let rest = &data[at..];
        let mut taken = 0;
        let trace = match &trace_head {
            Val::Null => None,
            Val::Arr(t) => {
                let metadata = match t.len() {
                    5 => None,
                    6 if matches!(t[5], Val::Num(Num::Int(1))) => {
                        Some(segments.get(1).ok_or(NotMine)?.to_vec())
                    }
                    _ => return Err(NotMine),
                };
                let trace = Trace {
                    micros: int(&t[0])?,
                    eid: string(&t[1])?,
                    agent_version: string(&t[2])?,
                    scenario: string(&t[3])?,
                    completed_at: string(&t[4])?,
                    messages: rest.to_vec(),
                    attachments: segments.first().ok_or(NotMine)?.to_vec(),
                    metadata,
                };
                taken = if trace.metadata.is_some() { 2 } else { 1 };
                Some(trace)
            }
            _ => return Err(NotMine),
        };
        if trace.is_none() && !rest.is_empty() {
            return Err(NotMine);
        }
        let evaluation = match &evaluation_head {
            Val::Null => None,
            Val::Arr(e) if e.len() == 5 => {
                let view = segments.get(taken).ok_or(NotMine)?.to_vec();
                let scores = segments.get(taken + 1).ok_or(NotMine)?;
                taken += 2;
                Some(Evaluation {
                    micros: int(&e[0])?,
                    eid: string(&e[1])?,
                    evaluation_id: string(&e[2])?,
                    view,
                    scores: if scores.is_empty() { None } else { Some(scores.to_vec()) },
                    reward: match &e[3] {
                        Val::Null => None,
                        Val::Num(Num::Float(f)) => Some(*f),
                        _ => return Err(NotMine),
                    },
                    passed: match &e[4] {
                        Val::Null => None,
                        Val::Bool(b) => Some(*b),
                        _ => return Err(NotMine),
                    },
                })
            }
            _ => return Err(NotMine),
        };
        let pending_heads = arr(&pending_heads)?;
        if segments.len() != taken + pending_heads.len() {
            return Err(NotMine);
        }
        let mut pending = Vec::with_capacity(pending_heads.len());
        for (p, value) in pending_heads.iter().zip(&segments[taken..]) {
            let p = arr(p)?;
            if p.len() != 5 {
                return Err(NotMine);
            }
            pending.push(Pending {
                event_id: string(&p[0])?,
                topic: string(&p[1])?,
                partition: int(&p[2])?,
                offset: int(&p[3])?,
                timestamp_ms: match &p[4] {
                    Val::Null => None,
                    v => Some(int(v)?),
                },
                value: value.to_vec(),
            });
        }
        let mut label_map = BTreeMap::new();
        for item in arr(&labels)? {
            let item = arr(item)?;
            let (rubric, comment) = match item.len() {
                3 => (None, None),
                7 | 8 => {
                    let rubric =
                        [int(&item[3])?, int(&item[4])?, int(&item[5])?, int(&item[6])?];
                    (Some(rubric), if item.len() == 8 { Some(string(&item[7])?) } else { None })
                }
                _ => return Err(NotMine),
            };
            let label = Label { micros: int(&item[1])?, eid: string(&item[2])?, rubric, comment };
            if label_map.insert(string(&item[0])?, label).is_some() {
                return Err(NotMine);
            }
        }
        Ok(State {
            trace_id: string(&trace_id)?,
            org: opt_string(&org)?,
            project: opt_string(&project)?,
            seen: string_set(&seen)?,
            pending,
            first_pending_at: opt_number(&first_pending_at)?,
            trace,
            evaluation,
            labels: label_map,
            skipped_by: string_set(&skipped_by)?,
            updated_at: int(&updated_at)?,
            deleted_at: opt_number(&deleted_at)?,
            deleted_revision: int(&deleted_revision)?,
        })
    }

    // --- the snapshot (`join._snapshot`, `records.encode_snapshot`) ---------------------------

    /// The current snapshot's value and its `rl-export-record-at` header (None for a
    /// tombstone); NotMine before the trace exists, or when the record would hold a NUL
    /// byte of its own (the Python path then encodes it the plain way).
    pub fn encode(&self, threshold: f64, rules_version: i64) -> R<(Vec<u8>, Option<Vec<u8>>)> {
        if self.deleted() {
            let mut out = Vec::with_capacity(128);
            let mut o = Obj::new(&mut out, true);
            write_str(o.key("trace_id"), &self.trace_id, true);
            opt_str_seps(o.key("org"), self.org.as_deref());
            opt_str_seps(o.key("project"), self.project.as_deref());
            write_i64(o.key("revision"), ERASED_REVISION); // wins over any revision
            o.key("deleted").extend_from_slice(b"true");
            o.close();
            return Ok((out, None));
        }
        let trace = self.trace.as_ref().ok_or(NotMine)?;
        let (org, project) = (self.org.as_deref().ok_or(NotMine)?, self.project.as_deref().ok_or(NotMine)?);
        // human_reward: integer sums over the current labels.
        let mut sums = [0i64; 4];
        let mut n = 0i64;
        for label in self.labels.values() {
            if let Some(rubric) = label.rubric {
                n += 1;
                for (s, r) in sums.iter_mut().zip(rubric) {
                    *s += r;
                }
            }
        }
        let human = if n > 0 {
            let reward = sums.iter().sum::<i64>() as f64 / (20 * n) as f64;
            Some((reward, reward >= threshold))
        } else {
            None
        };
        let evaluation = self.evaluation.as_ref();
        let scored = evaluation.filter(|e| e.scores.is_some());

        let mut out: Vec<u8> = Vec::with_capacity(1024 + trace.messages.len());
        out.extend_from_slice(b"{\"trace_id\":");
        write_str(&mut out, &self.trace_id, true);
        out.extend_from_slice(b",\"org\":");
        write_str(&mut out, org, true);
        out.extend_from_slice(b",\"project\":");
        write_str(&mut out, project, true);
        out.extend_from_slice(b",\"reward_source\":");
        let a = out.len();
        out.extend_from_slice(b"null,\"revision\":");
        write_i64(&mut out, self.revision());
        out.extend_from_slice(b",\"reward\":");
        let b = out.len();
        out.extend_from_slice(b"null,\"passed\":");
        let c = out.len();
        out.extend_from_slice(b"null,\"rubric\":");
        let fixed = out.len(); // from here to the messages, no NUL byte may be written
        match human {
            None => out.extend_from_slice(b"null"),
            Some(_) => {
                let mut o = Obj::new(&mut out, true);
                for (name, s) in ["correctness", "helpfulness", "efficiency", "safety"].iter().zip(sums) {
                    write_f64(o.key(name), s as f64 / n as f64);
                }
                o.close();
            }
        }
        out.extend_from_slice(b",\"labels_count\":");
        write_i64(&mut out, n);
        out.extend_from_slice(b",\"labelers\":");
        str_list_seps(&mut out, self.labels.iter().filter(|(_, l)| l.rubric.is_some()).map(|(k, _)| k));
        out.extend_from_slice(b",\"skipped_by\":");
        str_list_seps(&mut out, self.skipped_by.iter());
        out.extend_from_slice(b",\"evaluator_scores\":");
        match scored {
            Some(e) => write_raw(&mut out, e.scores.as_deref().unwrap_or_default(), true),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"evaluation\":");
        match evaluation {
            Some(e) => write_raw(&mut out, &e.view, true),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"messages\":");
        if out[fixed..].contains(&0) {
            return Err(NotMine);
        }
        let e = out.len();
        write_raw(&mut out, &trace.messages, true);
        let f = out.len();
        out.extend_from_slice(b",\"agent_version\":");
        write_str(&mut out, &trace.agent_version, true);
        out.extend_from_slice(b",\"scenario\":");
        write_str(&mut out, &trace.scenario, true);
        out.extend_from_slice(b",\"attachments\":");
        write_raw(&mut out, &trace.attachments, true);
        out.extend_from_slice(b",\"completed_at\":");
        write_str(&mut out, &trace.completed_at, true);
        out.extend_from_slice(b",\"updated_at\":\"");
        format_micros(&mut out, self.updated_at);
        out.extend_from_slice(b"\",\"pass_threshold\":");
        write_f64(&mut out, threshold);
        out.extend_from_slice(b",\"rules_version\":");
        write_i64(&mut out, rules_version);
        out.extend_from_slice(b",\"human_labels\":[");
        let mut first = true;
        for (labeler, label) in &self.labels {
            let Some(rubric) = label.rubric else { continue };
            if !first {
                out.push(b',');
            }
            first = false;
            let mut o = Obj::new(&mut out, true);
            write_str(o.key("labeler"), labeler, true);
            let mut r = Obj::new(o.key("rubric"), true);
            for (name, v) in ["correctness", "helpfulness", "efficiency", "safety"].iter().zip(rubric) {
                write_i64(r.key(name), v);
            }
            r.close();
            opt_str_seps(o.key("comment"), label.comment.as_deref());
            let at = o.key("occurred_at");
            at.push(b'"');
            format_micros(at, label.micros);
            at.push(b'"');
            o.close();
        }
        out.push(b']');
        if let Some(metadata) = &trace.metadata {
            out.extend_from_slice(b",\"metadata\":");
            write_raw(&mut out, metadata, true);
        }
        if out[f..].contains(&0) {
            return Err(NotMine);
        }
        let d = out.len();
        out.extend_from_slice(b",\"human\":");
        match human {
            None => out.extend_from_slice(b"null"),
            Some((reward, passed)) => {
                out.extend_from_slice(b"{\"reward\":");
                write_f64(&mut out, reward);
                out.extend_from_slice(b",\"passed\":");
                write_opt_bool(&mut out, Some(passed));
                out.push(b'}');
            }
        }
        out.extend_from_slice(b",\"evaluator\":");
        match scored {
            None => out.extend_from_slice(b"null"),
            Some(e) => {
                out.extend_from_slice(b"{\"reward\":");
                write_opt_f64(&mut out, e.reward);
                out.extend_from_slice(b",\"passed\":");
                write_opt_bool(&mut out, e.passed);
                out.push(b'}');
            }
        }
        out.extend_from_slice(b",\"deleted\":false}");
        let mut header = Vec::with_capacity(40);
        for (n, v) in [a, b, c, d, e, f].iter().enumerate() {
            if n > 0 {
                header.push(b',');
            }
            write_i64(&mut header, *v as i64);
        }
        Ok((out, Some(header)))
    }
}

fn opt_str(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(s) => write_str(out, s, false),
        None => out.extend_from_slice(b"null"),
    }
}

fn opt_str_seps(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(s) => write_str(out, s, true),
        None => out.extend_from_slice(b"null"),
    }
}

fn opt_num(out: &mut Vec<u8>, v: Option<Num>) {
    match v {
        Some(n) => write_num(out, n),
        None => out.extend_from_slice(b"null"),
    }
}

fn str_list<'s>(out: &mut Vec<u8>, items: impl Iterator<Item = &'s String>) {
    out.push(b'[');
    for (n, s) in items.enumerate() {
        if n > 0 {
            out.push(b',');
        }
        write_str(out, s, false);
    }
    out.push(b']');
}

fn str_list_seps<'s>(out: &mut Vec<u8>, items: impl Iterator<Item = &'s String>) {
    out.push(b'[');
    for (n, s) in items.enumerate() {
        if n > 0 {
            out.push(b',');
        }
        write_str(out, s, true);
    }
    out.push(b']');
}

fn arr<'v, 'a>(v: &'v Val<'a>) -> R<&'v Vec<Val<'a>>> {
    match v {
        Val::Arr(items) => Ok(items),
        _ => Err(NotMine),
    }
}

fn int(v: &Val<'_>) -> R<i64> {
    match v {
        Val::Num(Num::Int(i)) => Ok(*i),
        _ => Err(NotMine),
    }
}

fn string(v: &Val<'_>) -> R<String> {
    match v {
        Val::Str(s) => Ok(s.to_string()),
        _ => Err(NotMine),
    }
}

fn opt_string(v: &Val<'_>) -> R<Option<String>> {
    match v {
        Val::Null => Ok(None),
        v => string(v).map(Some),
    }
}

fn opt_number(v: &Val<'_>) -> R<Option<Num>> {
    match v {
        Val::Null => Ok(None),
        Val::Num(n) => Ok(Some(*n)),
        _ => Err(NotMine),
    }
}

fn string_set(v: &Val<'_>) -> R<BTreeSet<String>> {
    let items = arr(v)?;
    let mut set = BTreeSet::new();
    for item in items {
        if !set.insert(string(item)?) {
            return Err(NotMine);
        }
    }
    Ok(set)
}
