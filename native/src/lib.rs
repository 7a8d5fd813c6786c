//! `rl_export_native`: the join's native core (see `rl_export.stream.native`).
//!
//! The Python rules (`rl_export.stream.join`, `state`, `model.eventview`, `model.records`) are
//! the reference: for every input this core takes, it gives the same bytes (states,
//! snapshots, headers) and the same verdicts, and for every input it is not sure of it says
//! "not mine" (None, or -1 from a merge) and leaves the Python path to decide. The tests
//! (`tests/unit/stream/test_native.py`) run both on generated event sequences and compare.

mod event;
mod json;
mod record;
mod state;
mod time;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFloat, PyString, PyTuple};

use crate::json::{Num, NotMine, R};

/// The settings the native rules depend on, and where events may come from.
#[pyclass(frozen, module = "rl_export_native")]
struct Core {
    max_bytes: usize,
    tolerance_s: f64,
    threshold: f64,
    rules_version: i64,
}

/// A decoded, checked input event.
#[pyclass(frozen, module = "rl_export_native")]
struct Event {
    inner: event::Event,
    #[pyo3(get)]
    trace_id: Py<PyString>,
    #[pyo3(get)]
    event_type: Py<PyString>,
    /// The trace_id as the table's key (UTF-8).
    #[pyo3(get)]
    key: Py<PyBytes>,
}

/// One trace's state, merged and written natively.
#[pyclass(module = "rl_export_native")]
struct State {
    inner: state::State,
    threshold: f64,
    rules_version: i64,
}

fn num_of(value: &Bound<'_, PyAny>) -> PyResult<Num> {
    if value.is_instance_of::<PyFloat>() {
        Ok(Num::Float(value.extract::<f64>()?))
    } else {
        Ok(Num::Int(value.extract::<i64>()?))
    }
}

#[pymethods]
impl Core {
    #[new]
    fn new(max_bytes: usize, tolerance_s: f64, threshold: f64, rules_version: i64) -> Self {
        Core { max_bytes, tolerance_s, threshold, rules_version }
    }

    /// The event of a Kafka value (``read_event``'s checks: size, schema, topic family
    /// 1-3 or 0 for any, key, clock), or None: not mine.
    #[pyo3(signature = (raw, key, family, now_us))]
    fn decode(
        &self,
        py: Python<'_>,
        raw: &[u8],
        key: Option<&[u8]>,
        family: u8,
        now_us: i64,
    ) -> PyResult<Option<Event>> {
        let placement = event::Placement {
            max_bytes: self.max_bytes,
            family,
            key,
            now_us,
            tolerance_s: self.tolerance_s,
        };
        Ok(match event::decode(raw, &placement) {
            Ok(inner) => Some(Event {
                trace_id: PyString::new(py, &inner.trace_id).unbind(),
                key: PyBytes::new(py, inner.trace_id.as_bytes()).unbind(),
                event_type: PyString::intern(py, inner.kind.name()).unbind(),
                inner,
            }),
            Err(NotMine) => None,
        })
    }

    /// A state of a trace never seen.
    fn new_state(&self, trace_id: &str) -> State {
        State {
            inner: state::State::new(trace_id),
            threshold: self.threshold,
            rules_version: self.rules_version,
        }
    }

    /// The state these table bytes hold, or None: not mine (another version or shape).
    fn load(&self, data: &[u8]) -> Option<State> {
        state::State::load(data).ok().map(|inner| State {
            inner,
            threshold: self.threshold,
            rules_version: self.rules_version,
        })
    }
}

/// Outcome codes of [`State::merge`]: the outcome, plus 4 when a snapshot is due.
fn outcome_code(outcome: state::Outcome, emits: bool) -> i32 {
    let code = match outcome {
        state::Outcome::Accepted => 0,
        state::Outcome::Duplicate => 1,
        state::Outcome::Pending => 2,
        state::Outcome::Ignored => 3,
    };
    code + if emits { 4 } else { 0 }
}

fn origin_of(message: &Bound<'_, PyAny>) -> R<state::Origin> {
    let get = |name: &str| message.getattr(name).map_err(|_| NotMine);
    Ok(state::Origin {
        value: get("value")?.extract::<Vec<u8>>().map_err(|_| NotMine)?,
        topic: get("topic")?.extract::<String>().map_err(|_| NotMine)?,
        partition: get("partition")?.extract::<i64>().map_err(|_| NotMine)?,
        offset: get("offset")?.extract::<i64>().map_err(|_| NotMine)?,
        timestamp_ms: get("timestamp_ms")?.extract::<Option<i64>>().map_err(|_| NotMine)?,
    })
}

#[pymethods]
impl State {
    /// Merge an event (``join.merge``); ``message`` is where it came from (kept if it
    /// waits). Returns the outcome code (accepted 0, duplicate 1, pending 2, ignored 3, + 4
    /// when a snapshot is due), or -1: not mine, the state unchanged.
    fn merge(
        &mut self,
        event: &Bound<'_, Event>,
        now: &Bound<'_, PyAny>,
        message: &Bound<'_, PyAny>,
    ) -> PyResult<i32> {
        let now = num_of(now)?;
        let mut origin = || origin_of(message);
        Ok(match self.inner.merge(&event.get().inner, now, &mut origin) {
            Ok((outcome, emits)) => outcome_code(outcome, emits),
            Err(NotMine) => -1,
        })
    }

    /// ``dump_state_parts``: the state without its conversation, and the conversation.
    fn dump<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>) {
        let (head, conversation) = self.inner.dump();
        (PyBytes::new(py, &head), PyBytes::new(py, conversation))
    }

    /// ``encode_current``: the snapshot's value and its record-at header (None for a
    /// tombstone); None: not mine (the Python path encodes it).
    fn encode<'py>(
        &self,
        py: Python<'py>,
    ) -> Option<(Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>)> {
        match self.inner.encode(self.threshold, self.rules_version) {
            Ok((value, header)) => {
                Some((PyBytes::new(py, &value), header.map(|h| PyBytes::new(py, &h))))
            }
            Err(NotMine) => None,
        }
    }

    /// ``processor.expiry_mark``: the expiry index's entry, or None.
    fn mark<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.inner.mark().map(|m| PyBytes::new(py, &m))
    }

    /// The end of a batch for this state, in one call: its bytes and conversation
    /// (``dump``), its expiry mark (``mark``), and with ``emit`` its snapshot (``encode``:
    /// None when not emitting, or when the snapshot is not the core's to encode).
    #[allow(clippy::type_complexity)]
    fn finish<'py>(
        &self,
        py: Python<'py>,
        emit: bool,
    ) -> (
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Option<Bound<'py, PyBytes>>,
        Option<(Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>)>,
    ) {
        let (head, conversation) = self.dump(py);
        let encoded = if emit { self.encode(py) } else { None };
        (head, conversation, self.mark(py), encoded)
    }

    /// True when the trace exists and its conversation is kept apart (not yet set).
    #[getter]
    fn wants_conversation(&self) -> bool {
        self.inner.trace.as_ref().is_some_and(|t| t.messages.is_empty())
    }

    fn set_conversation(&mut self, conversation: &[u8]) -> PyResult<()> {
        match self.inner.trace.as_mut() {
            Some(t) => {
                t.messages = conversation.to_vec();
                Ok(())
            }
            None => Err(PyValueError::new_err("the state has no trace")),
        }
    }
}

/// A float as orjson writes it (for the tests that compare the two).
#[pyfunction]
fn format_float(value: f64) -> PyResult<String> {
    if !value.is_finite() {
        return Err(PyValueError::new_err("not a finite float"));
    }
    let mut out = Vec::new();
    json::write_f64(&mut out, value);
    Ok(String::from_utf8(out).unwrap())
}

fn reward_dict<'py>(py: Python<'py>, reward: record::Reward) -> PyResult<Bound<'py, PyAny>> {
    match reward {
        None => Ok(py.None().into_bound(py)),
        Some((r, p)) => {
            let d = PyDict::new(py);
            d.set_item("reward", r)?;
            d.set_item("passed", p)?;
            Ok(d.into_any())
        }
    }
}

/// ``SnapshotLines.from_record``'s reading of a snapshot in the record layout: (trace_id,
/// org, project, revision, human, evaluator, updated_at, a, b, c, d, (e, f) or None), or
/// None: not mine (the Python method reads it).
#[pyfunction]
fn read_record<'py>(
    py: Python<'py>,
    value: &[u8],
    header: &[u8],
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let Ok(found) = record::read(value, header) else { return Ok(None) };
    let [a, b, c, d] = found.at;
    let messages_at: Bound<'py, PyAny> = match found.messages_at {
        Some(pair) => pair.into_pyobject(py)?.into_any(),
        None => py.None().into_bound(py),
    };
    let items: Vec<Bound<'py, PyAny>> = vec![
        PyString::new(py, &found.trace_id).into_any(),
        PyString::new(py, &found.org).into_any(),
        PyString::new(py, &found.project).into_any(),
        found.revision.into_pyobject(py)?.into_any(),
        reward_dict(py, found.human)?,
        reward_dict(py, found.evaluator)?,
        PyString::new(py, &found.updated_at).into_any(),
        a.into_pyobject(py)?.into_any(),
        b.into_pyobject(py)?.into_any(),
        c.into_pyobject(py)?.into_any(),
        d.into_pyobject(py)?.into_any(),
        messages_at,
    ];
    Ok(Some(PyTuple::new(py, items)?))
}

/// A float as Python's ``repr`` writes it (for the tests that compare the two).
#[pyfunction]
fn format_repr(value: f64) -> PyResult<String> {
    if !value.is_finite() {
        return Err(PyValueError::new_err("not a finite float"));
    }
    let mut out = Vec::new();
    json::write_repr(&mut out, value);
    Ok(String::from_utf8(out).unwrap())
}

/// A string as ``codec.dumps`` writes it (for the tests that compare the two).
#[pyfunction]
fn format_string(value: &str) -> String {
    let mut out = Vec::new();
    json::write_str(&mut out, value, true);
    String::from_utf8(out).unwrap()
}

#[pymodule]
fn rl_export_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Core>()?;
    m.add_class::<Event>()?;
    m.add_class::<State>()?;
    m.add_function(wrap_pyfunction!(format_float, m)?)?;
    m.add_function(wrap_pyfunction!(format_string, m)?)?;
    m.add_function(wrap_pyfunction!(format_repr, m)?)?;
    m.add_function(wrap_pyfunction!(read_record, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
