//! ddl-trace: a Chrome trace-event recorder.
//!
//! Spans are recorded as "complete" (`"ph": "X"`) events with a name, a category, a start
//! time and a duration in microseconds, a process id (the MPI rank, see [`set_pid`]) and a
//! small per-thread id; every thread that records gets a `thread_name` metadata (`"ph": "M"`)
//! event. [`write`](fn@write) produces the JSON object format (`{"traceEvents": [...]}`) that Perfetto
//! (ui.perfetto.dev) and `chrome://tracing` open.
//!
//! Timestamps (`ts`) are microseconds since the Unix epoch: the wall clock read once, at the
//! first use, plus the monotonic clock's progress since then. Traces written by several ranks
//! (each with its own [`set_pid`]) therefore share one time axis and can be merged by
//! concatenating their `traceEvents` arrays, e.g.
//! `jq -s '{traceEvents: map(.traceEvents) | add}' trace*.json > all.json`.
//!
//! Recording is global and **off by default**. While it is off, [`span`] costs one relaxed
//! atomic load and returns an inert guard. After [`enable`], a span reads the monotonic clock
//! when it opens and when its [`SpanGuard`] is dropped, and appends one event to the calling
//! thread's own buffer.
//!
//! Buffers: each thread owns a buffer (created on its first event and reached through a
//! `thread_local`) that only that thread appends to, so the lock taken per event is never
//! contended while recording. Every buffer is also registered in a global sink, which keeps it
//! after its thread exits: [`write`](fn@write) therefore sees the events of finished threads *and* of
//! threads that are still alive (for example a rayon pool), without any flush call.
//!
//! ```
//! ddl_trace::enable();
//! ddl_trace::set_thread_name("main");
//! {
//!     let _outer = ddl_trace::span("step", "train");
//!     let _inner = ddl_trace::span_args("allreduce", "comm", &[("bucket", 3)]);
//! }
//! let path = std::env::temp_dir().join(format!("ddl-trace-doc-{}.json", std::process::id()));
//! let n = ddl_trace::write(&path).unwrap();
//! assert!(n >= 2);
//! # std::fs::remove_file(&path).unwrap();
//! ```

#![warn(missing_docs)]

use std::borrow::Cow;
use std::cell::OnceCell;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Largest number of numeric arguments one span carries; further ones are dropped.
pub const MAX_ARGS: usize = 3;

/// Errors of [`write`](fn@write).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Creating or writing the trace file failed.
    #[error("cannot write trace file {path}: {source}")]
    Io {
        /// The trace file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static PID: AtomicU32 = AtomicU32::new(0);
static NEXT_TID: AtomicU32 = AtomicU32::new(1);
static EPOCH: OnceLock<(Instant, u64)> = OnceLock::new();
static SINK: Mutex<Vec<Arc<ThreadBuf>>> = Mutex::new(Vec::new());

thread_local! {
    static LOCAL: OnceCell<Arc<ThreadBuf>> = const { OnceCell::new() };
}

/// Locks `m`, ignoring poisoning: a panic elsewhere must not lose the trace.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The instant all timestamps are measured from (fixed on first use) and the wall-clock time
/// at that instant in nanoseconds since the Unix epoch.
fn epoch_pair() -> (Instant, u64) {
    *EPOCH.get_or_init(|| {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        (Instant::now(), unix)
    })
}

/// The instant event times are measured from.
fn epoch() -> Instant {
    epoch_pair().0
}

/// Numeric arguments of one event, stored inline (no allocation).
#[derive(Clone, Copy, Debug, Default)]
struct Args {
    len: u8,
    kv: [(&'static str, i64); MAX_ARGS],
}

impl Args {
    fn new(args: &[(&'static str, i64)]) -> Args {
        let mut a = Args::default();
        for &(k, v) in args.iter().take(MAX_ARGS) {
            a.kv[a.len as usize] = (k, v);
            a.len += 1;
        }
        a
    }

    fn as_slice(&self) -> &[(&'static str, i64)] {
        &self.kv[..self.len as usize]
    }
}

/// One complete event, times in nanoseconds since [`epoch`].
#[derive(Clone, Debug)]
struct Event {
    name: Cow<'static, str>,
    cat: &'static str,
    ts_ns: u64,
    dur_ns: u64,
    args: Args,
}

/// One thread's buffer; only its own thread appends, [`write`](fn@write) and [`clear`] read it.
#[derive(Debug)]
struct ThreadBuf {
    tid: u32,
    name: Mutex<String>,
    events: Mutex<Vec<Event>>,
}

/// Runs `f` on the calling thread's buffer, creating and registering it on first use.
/// Does nothing during thread teardown, when the thread-local is already gone.
fn with_local<R>(f: impl FnOnce(&ThreadBuf) -> R) -> Option<R> {
    LOCAL
        .try_with(|cell| {
            let buf = cell.get_or_init(|| {
                let tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
                let name = std::thread::current()
                    .name()
                    .map_or_else(|| format!("thread-{tid}"), str::to_string);
                let buf = Arc::new(ThreadBuf {
                    tid,
                    name: Mutex::new(name),
                    events: Mutex::new(Vec::with_capacity(1024)),
                });
                lock(&SINK).push(Arc::clone(&buf));
                buf
            });
            f(buf)
        })
        .ok()
}

fn push(ev: Event) {
    with_local(|b| lock(&b.events).push(ev));
}

/// Turns recording on (for the whole process).
pub fn enable() {
    epoch();
    ENABLED.store(true, Ordering::Relaxed);
}

/// Turns recording off; events already recorded are kept until [`clear`].
pub fn disable() {
    ENABLED.store(false, Ordering::Relaxed);
}

/// Whether spans are being recorded.
#[inline]
pub fn is_enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Sets the trace's process id, normally the MPI rank (default 0). Applies to every event
/// at [`write`](fn@write) time.
pub fn set_pid(pid: u32) {
    PID.store(pid, Ordering::Relaxed);
}

/// Names the calling thread in the trace (default: the std thread name, or `thread-<tid>`).
pub fn set_thread_name(name: impl Into<String>) {
    let name = name.into();
    with_local(|b| *lock(&b.name) = name);
}

/// The calling thread's trace id (a small integer, unique in this process, never reused).
pub fn thread_id() -> u32 {
    with_local(|b| b.tid).unwrap_or(0)
}

/// An open span: the event is recorded when the guard is dropped. Inert (records nothing)
/// when it was opened while recording was off.
#[must_use = "a span records its duration when the guard is dropped; bind it with `let _g = ...`"]
#[derive(Debug)]
pub struct SpanGuard {
    open: Option<Open>,
}

#[derive(Debug)]
struct Open {
    name: Cow<'static, str>,
    cat: &'static str,
    start: Instant,
    args: Args,
}

impl SpanGuard {
    /// Whether this guard will record an event.
    pub fn is_recording(&self) -> bool {
        self.open.is_some()
    }
}

impl Drop for SpanGuard {
    #[inline]
    fn drop(&mut self) {
        if let Some(o) = self.open.take() {
            finish(o);
        }
    }
}

#[cold]
fn finish(o: Open) {
    let end = Instant::now();
    let ts_ns = o.start.saturating_duration_since(epoch()).as_nanos() as u64;
    let dur_ns = end.saturating_duration_since(o.start).as_nanos() as u64;
    push(Event {
        name: o.name,
        cat: o.cat,
        ts_ns,
        dur_ns,
        args: o.args,
    });
}

/// Opens a span named `name` in category `cat`; it ends when the returned guard is dropped.
/// Costs one relaxed atomic load while recording is off.
#[inline]
pub fn span(name: impl Into<Cow<'static, str>>, cat: &'static str) -> SpanGuard {
    if !is_enabled() {
        return SpanGuard { open: None };
    }
    open(name.into(), cat, Args::default())
}

/// Like [`span`], with up to [`MAX_ARGS`] numeric arguments shown in the viewer (for example
/// `&[("bucket", 3)]`, `&[("replica", 1)]`, `&[("color", 0)]`).
#[inline]
pub fn span_args(
    name: impl Into<Cow<'static, str>>,
    cat: &'static str,
    args: &[(&'static str, i64)],
) -> SpanGuard {
    if !is_enabled() {
        return SpanGuard { open: None };
    }
    open(name.into(), cat, Args::new(args))
}

#[cold]
fn open(name: Cow<'static, str>, cat: &'static str, args: Args) -> SpanGuard {
    SpanGuard {
        open: Some(Open {
            name,
            cat,
            start: Instant::now(),
            args,
        }),
    }
}

/// Records an interval measured elsewhere (`start`, lasting `dur`) as a complete event of the
/// calling thread, if recording is on.
pub fn record(
    name: impl Into<Cow<'static, str>>,
    cat: &'static str,
    start: Instant,
    dur: Duration,
    args: &[(&'static str, i64)],
) {
    if !is_enabled() {
        return;
    }
    push(Event {
        name: name.into(),
        cat,
        ts_ns: start.saturating_duration_since(epoch()).as_nanos() as u64,
        dur_ns: dur.as_nanos() as u64,
        args: Args::new(args),
    });
}

/// Number of events recorded so far (all threads).
pub fn event_count() -> usize {
    lock(&SINK).iter().map(|b| lock(&b.events).len()).sum()
}

/// Discards all recorded events (thread names and ids are kept).
pub fn clear() {
    for b in lock(&SINK).iter() {
        lock(&b.events).clear();
    }
}

/// Writes `s` as a JSON string literal.
fn json_str(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    serde_json::to_writer(&mut *w, s).map_err(std::io::Error::from)
}

/// Writes `ns` nanoseconds as microseconds with three decimals.
fn micros(w: &mut impl Write, ns: u64) -> std::io::Result<()> {
    write!(w, "{}.{:03}", ns / 1000, ns % 1000)
}

/// Writes every event recorded so far, from all threads, as one Chrome trace JSON object to
/// `out`, and returns the number of complete events written. Events stay recorded.
pub fn write_to(out: &mut impl Write) -> std::io::Result<usize> {
    let pid = PID.load(Ordering::Relaxed);
    let base_ns = epoch_pair().1;
    let process = format!("rank {pid}");
    let mut threads: Vec<(u32, String, Vec<Event>)> = lock(&SINK)
        .iter()
        .map(|b| (b.tid, lock(&b.name).clone(), lock(&b.events).clone()))
        .collect();
    threads.sort_by_key(|t| t.0);
    out.write_all(b"{\"traceEvents\":[\n")?;
    out.write_all(b"{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":")?;
    write!(out, "{pid},\"tid\":0,\"args\":{{\"name\":")?;
    json_str(out, &process)?;
    out.write_all(b"}}")?;
    let mut n = 0;
    for (tid, name, mut events) in threads {
        out.write_all(b",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":")?;
        write!(out, "{pid},\"tid\":{tid},\"args\":{{\"name\":")?;
        json_str(out, &name)?;
        out.write_all(b"}}")?;
        // Parents before children at equal start times: longer first.
        events.sort_by(|a, b| a.ts_ns.cmp(&b.ts_ns).then(b.dur_ns.cmp(&a.dur_ns)));
        for e in &events {
            out.write_all(b",\n{\"name\":")?;
            json_str(out, &e.name)?;
            out.write_all(b",\"cat\":")?;
            json_str(out, e.cat)?;
            out.write_all(b",\"ph\":\"X\",\"ts\":")?;
            micros(out, base_ns + e.ts_ns)?;
            out.write_all(b",\"dur\":")?;
            micros(out, e.dur_ns)?;
            write!(out, ",\"pid\":{pid},\"tid\":{tid}")?;
            if e.args.len > 0 {
                out.write_all(b",\"args\":{")?;
                for (i, (k, v)) in e.args.as_slice().iter().enumerate() {
                    if i > 0 {
                        out.write_all(b",")?;
                    }
                    json_str(out, k)?;
                    write!(out, ":{v}")?;
                }
                out.write_all(b"}")?;
            }
            out.write_all(b"}")?;
            n += 1;
        }
    }
    out.write_all(b"\n],\"displayTimeUnit\":\"ms\"}\n")?;
    Ok(n)
}

/// The trace file of `rank` in a multi-rank job: `path` itself for rank 0, `STEM.rankN.EXT`
/// beside it otherwise, so that every rank writes its own file and they can be merged later.
pub fn rank_path(path: &Path, rank: usize) -> PathBuf {
    if rank == 0 {
        return path.to_path_buf();
    }
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("trace");
    let ext = path.extension().and_then(|s| s.to_str()).unwrap_or("json");
    path.with_file_name(format!("{stem}.rank{rank}.{ext}"))
}

/// Writes all events recorded so far to the file `path` (see [`write_to`]) and returns the
/// number of complete events written.
pub fn write(path: &Path) -> Result<usize, TraceError> {
    let io = |source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::create(path).map_err(io)?;
    let mut w = BufWriter::new(file);
    let n = write_to(&mut w).map_err(io)?;
    w.flush().map_err(io)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Recording is process-global: tests that toggle it run one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn trace_json() -> Value {
        let mut buf = Vec::new();
        write_to(&mut buf).unwrap();
        serde_json::from_slice(&buf).expect("trace is valid JSON")
    }

    fn complete<'a>(v: &'a Value, name: &str) -> Vec<&'a Value> {
        v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X" && e["name"] == name)
            .collect()
    }

    #[test]
    fn disabled_records_nothing() {
        let _s = lock(&SERIAL);
        disable();
        let before = event_count();
        {
            let g = span("disabled-span", "test");
            assert!(!g.is_recording());
        }
        record(
            "disabled-record",
            "test",
            Instant::now(),
            Duration::from_micros(5),
            &[],
        );
        assert_eq!(event_count(), before);
        assert!(complete(&trace_json(), "disabled-span").is_empty());
    }

    #[test]
    fn valid_json_with_required_keys_and_args() {
        let _s = lock(&SERIAL);
        enable();
        set_pid(3);
        set_thread_name("json \"quoted\" thread");
        {
            let _g = span_args("allreduce", "comm", &[("bucket", 7), ("color", 1)]);
        }
        record(
            "waited",
            "data",
            Instant::now(),
            Duration::from_nanos(1500),
            &[],
        );
        disable();
        let v = trace_json();
        for e in v["traceEvents"].as_array().unwrap() {
            for key in ["name", "ph", "pid", "tid"] {
                assert!(e.get(key).is_some(), "{e} lacks {key}");
            }
            if e["ph"] == "X" {
                assert!(e["ts"].as_f64().unwrap() >= 0.0);
                assert!(e["dur"].as_f64().unwrap() >= 0.0);
                assert!(e["cat"].is_string());
            }
        }
        let ev = complete(&v, "allreduce");
        let e = ev.last().unwrap();
        assert_eq!(e["pid"], 3);
        assert_eq!(e["args"]["bucket"], 7);
        assert_eq!(e["args"]["color"], 1);
        let waited = complete(&v, "waited");
        assert_eq!(waited.last().unwrap()["dur"].as_f64().unwrap(), 1.5);
        let tid = e["tid"].as_u64().unwrap();
        let named = v["traceEvents"].as_array().unwrap().iter().any(|m| {
            m["ph"] == "M" && m["tid"] == tid && m["args"]["name"] == "json \"quoted\" thread"
        });
        assert!(named);
        set_pid(0);
    }

    #[test]
    fn nested_spans_nest_in_time() {
        let _s = lock(&SERIAL);
        enable();
        // Enough work between the clock reads to dwarf the JSON timestamps' f64 rounding
        // (about 0.25 us at Unix-epoch magnitudes).
        let work = || (0..200_000u64).fold(0u64, |a, x| std::hint::black_box(a ^ x));
        {
            let _outer = span("nest-outer", "test");
            work();
            {
                let _inner = span("nest-inner", "test");
                work();
            }
            work();
        }
        disable();
        let v = trace_json();
        let outer = complete(&v, "nest-outer");
        let inner = complete(&v, "nest-inner");
        let (o, i) = (outer.last().unwrap(), inner.last().unwrap());
        assert_eq!(o["tid"], i["tid"]);
        let (ots, odur) = (o["ts"].as_f64().unwrap(), o["dur"].as_f64().unwrap());
        let (its, idur) = (i["ts"].as_f64().unwrap(), i["dur"].as_f64().unwrap());
        assert!(idur > 1.0 && odur > 2.0 * idur, "{o} {i}");
        assert!(ots < its && its + idur < ots + odur, "{o} {i}");
    }

    #[test]
    fn threads_get_own_ids_and_names_and_survive_exit() {
        let _s = lock(&SERIAL);
        enable();
        let handles: Vec<_> = (0..4)
            .map(|k| {
                std::thread::Builder::new()
                    .name(format!("mt-worker-{k}"))
                    .spawn(move || {
                        for j in 0..10 {
                            let _g = span_args("mt-work", "test", &[("worker", k), ("j", j)]);
                        }
                        thread_id()
                    })
                    .unwrap()
            })
            .collect();
        let tids: Vec<u32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        disable();
        let mut uniq = tids.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 4);
        let v = trace_json();
        let work = complete(&v, "mt-work");
        for (k, tid) in tids.iter().enumerate() {
            let mine: Vec<_> = work.iter().filter(|e| e["tid"] == *tid).collect();
            assert_eq!(mine.len(), 10, "thread {k}");
            assert!(mine.iter().all(|e| e["args"]["worker"] == k as i64));
            assert!(v["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["ph"] == "M"
                    && m["tid"] == *tid
                    && m["args"]["name"] == format!("mt-worker-{k}")));
        }
    }

    #[test]
    fn write_file_and_clear() {
        let _s = lock(&SERIAL);
        enable();
        {
            let _g = span(format!("file-span-{}", 1), "test");
        }
        disable();
        let path = std::env::temp_dir().join(format!("ddl-trace-test-{}.json", std::process::id()));
        let n = write(&path).unwrap();
        assert!(n >= 1);
        let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(complete(&v, "file-span-1").len(), 1);
        std::fs::remove_file(&path).unwrap();
        clear();
        assert_eq!(event_count(), 0);
        let err = write(Path::new("/nonexistent-dir/x/trace.json")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent-dir/x/trace.json"));
    }

    #[test]
    fn args_beyond_max_are_dropped() {
        let a = Args::new(&[("a", 1), ("b", 2), ("c", 3), ("d", 4)]);
        assert_eq!(a.as_slice(), &[("a", 1), ("b", 2), ("c", 3)]);
    }
}
