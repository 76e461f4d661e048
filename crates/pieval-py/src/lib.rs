//! `pieval._native`: the extension module of the Python package (`python/pieval/`,
//! `pyproject.toml`). The package's functions in `python/pieval/__init__.py` call these;
//! their documentation is there and in docs/python.md.
//!
//! Arrow crosses the boundary as Arrow C streams (the Arrow PyCapsule Interface:
//! `__arrow_c_stream__`, a capsule named `arrow_array_stream`), which pyarrow, polars and
//! pandas (through pyarrow) speak: a table's buffers are read where they are, and the
//! results handed back are pieval's own buffers. No text is copied by this layer.
//!
//! Work runs on a thread of its own while the calling thread waits without the GIL,
//! looking for Ctrl-C every 100 ms: on one, pieval is asked to stop
//! ([`pieval::interrupt`]), the thread is waited for (nothing half-written is left: every
//! artifact is committed atomically), and `KeyboardInterrupt` is raised.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use datafusion::arrow::record_batch::{RecordBatchIterator, RecordBatchReader};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

use pieval::Error;

/// The name the Arrow PyCapsule Interface gives a stream's capsule.
const STREAM_CAPSULE: &str = "arrow_array_stream";
/// The name datafusion-python looks for on a scalar function's capsule.
const UDF_CAPSULE: &str = "datafusion_scalar_udf";

/// A pieval error as the exception of `pieval.errors` its kind maps to, carrying the
/// file, line and field where pieval knows them. Messages quote hostile input: control
/// characters are escaped.
fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let (class, path, line, field) = match &e {
        Error::Input {
            path, line, field, ..
        } => ("InputError", Some(path.clone()), Some(*line), field.clone()),
        Error::Invalid { path, .. } => ("InputError", Some(path.clone()), None, None),
        Error::Config { path, .. } => ("ConfigError", Some(path.clone()), None, None),
        Error::Io { path, .. } => ("PievalIOError", Some(path.clone()), None, None),
        Error::Usage(_) => ("UsageError", None, None, None),
        Error::NotFound(_) => ("NotFoundError", None, None, None),
        Error::Query(_) | Error::DataFusion(_) | Error::Arrow(_) | Error::Parquet(_) => {
            ("QueryError", None, None, None)
        }
        Error::Crypto(_) => ("EvidenceError", None, None, None),
        _ => ("PievalError", None, None, None),
    };
    let message = pieval::text::escape_control(&e.to_string()).into_owned();
    let made = (|| -> PyResult<PyErr> {
        let module = py.import("pieval.errors")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("path", path.map(|p| p.display().to_string()))?;
        kwargs.set_item("line", line)?;
        kwargs.set_item("field", field)?;
        kwargs.set_item("exit_code", e.exit_code() as u8)?;
        let exc = module
            .getattr(class)?
            .call((message.clone(),), Some(&kwargs))?;
        Ok(PyErr::from_value(exc))
    })();
    made.unwrap_or_else(|_| PyRuntimeError::new_err(message))
}

/// Run `work` on a thread of its own; the caller waits without the GIL and answers
/// Ctrl-C (see the module's docs).
fn interruptible<T: Send + 'static>(
    py: Python<'_>,
    work: impl FnOnce() -> pieval::Result<T> + Send + 'static,
) -> PyResult<T> {
    // A stop asked of an earlier call that was given up on is not this call's.
    pieval::interrupt::clear();
    let (tx, rx) = std::sync::mpsc::channel();
    // (a receiver is not shared between threads; waiting without the GIL lends it)
    let rx = Mutex::new(rx);
    // 100 ms for the work's answer, without the GIL
    let wait = |py: Python<'_>| {
        py.detach(|| {
            rx.lock()
                .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected)?
                .recv_timeout(Duration::from_millis(100))
        })
    };
    let handle = std::thread::Builder::new()
        .name("pieval".into())
        .stack_size(pieval::engine::THREAD_STACK_BYTES)
        .spawn(move || {
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            let _ = tx.send(out);
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a thread: {e}")))?;
    loop {
        match wait(py) {
            Ok(out) => {
                let _ = handle.join();
                return match out {
                    Ok(Ok(v)) => {
                        // Ctrl-C while the work ended: still an interruption.
                        py.check_signals()?;
                        Ok(v)
                    }
                    Ok(Err(e)) => {
                        py.check_signals()?;
                        Err(to_py(py, e))
                    }
                    Err(_) => Err(PyRuntimeError::new_err(
                        "pieval panicked (a bug: please report it with the input)",
                    )),
                };
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Err(signal) = py.check_signals() {
                    pieval::interrupt::request();
                    // Wait for the work to stop, still answering Ctrl-C: a second one gives
                    // up waiting (the work then ends on its own, its artifacts atomic).
                    loop {
                        match wait(py) {
                            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                                if let Err(again) = py.check_signals() {
                                    return Err(again);
                                }
                            }
                            _ => break,
                        }
                    }
                    let _ = handle.join();
                    pieval::interrupt::clear();
                    return Err(signal);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let _ = handle.join();
                return Err(PyRuntimeError::new_err(
                    "pieval's work thread ended unanswered",
                ));
            }
        }
    }
}

/// The Arrow C stream of an object that exports one (`__arrow_c_stream__`).
fn import_stream(obj: &Bound<'_, PyAny>) -> PyResult<ArrowArrayStreamReader> {
    let capsule = obj.call_method0("__arrow_c_stream__")?;
    let capsule = capsule.cast::<PyCapsule>().map_err(PyErr::from)?;
    let name = capsule.name()?.map(|n| unsafe { n.as_cstr() }.to_owned());
    if name.as_deref().and_then(|n| n.to_str().ok()) != Some(STREAM_CAPSULE) {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "__arrow_c_stream__ gave a capsule that is not an Arrow stream",
        ));
    }
    let ptr = capsule
        .pointer_checked(Some(&CString::new(STREAM_CAPSULE).expect("no NUL")))?
        .as_ptr() as *mut FFI_ArrowArrayStream;
    // SAFETY: the capsule holds an ArrowArrayStream (its name says so); `from_raw` moves
    // it out and marks the capsule's copy released, as the interface asks of a consumer.
    let stream = unsafe { FFI_ArrowArrayStream::from_raw(ptr) };
    ArrowArrayStreamReader::try_new(stream)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("an Arrow stream: {e}")))
}

/// Record batches handed to Python as an Arrow C stream, once.
#[pyclass(module = "pieval._native", frozen)]
struct ArrowStream {
    stream: Mutex<Option<FFI_ArrowArrayStream>>,
}

impl ArrowStream {
    fn of(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), schema);
        let reader: Box<dyn RecordBatchReader + Send> = Box::new(reader);
        Self {
            stream: Mutex::new(Some(FFI_ArrowArrayStream::new(reader))),
        }
    }
}

#[pymethods]
impl ArrowStream {
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // A requested schema is a hint the producer may ignore (the interface says so).
        let _ = requested_schema;
        let stream = self
            .stream
            .lock()
            .map_err(|_| PyRuntimeError::new_err("the stream's lock"))?
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this Arrow stream was read already"))?;
        PyCapsule::new(
            py,
            stream,
            Some(CString::new(STREAM_CAPSULE).expect("no NUL")),
        )
    }
}

/// The JSON of a report (pieval's reports are serde types).
fn json<T: serde::Serialize>(value: &T) -> pieval::Result<String> {
    serde_json::to_string(value).map_err(|e| Error::Internal(format!("a report as JSON: {e}")))
}

/// `pieval` on the command line, as the binary runs it; its exit code.
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| pieval::cli::entry(argv))
}

/// Score predictions (an Arrow stream) against the corpus `cases`; the results and the
/// score report (JSON). `name` names the predictions in messages; without `predictions`,
/// it is the predictions file to read.
#[pyfunction]
#[pyo3(signature = (predictions, name, cases, output, run_id, mitigation = None, leakage_threshold = 0.5, experiment_name = None))]
#[allow(clippy::too_many_arguments)]
fn score(
    py: Python<'_>,
    predictions: Option<&Bound<'_, PyAny>>,
    name: String,
    cases: PathBuf,
    output: PathBuf,
    run_id: String,
    mitigation: Option<String>,
    leakage_threshold: f64,
    experiment_name: Option<String>,
) -> PyResult<(ArrowStream, String)> {
    let batches = match predictions {
        Some(p) => {
            let stream = import_stream(p)?;
            // Checked before any batch: a table without rows is still read by its columns.
            if stream.schema().index_of("case_id").is_err() {
                return Err(to_py(
                    py,
                    Error::input(
                        &name,
                        0,
                        Some("case_id"),
                        "no case_id column among the columns",
                    ),
                ));
            }
            let reader: pieval::corpus::predictions::Batches = Box::new(stream);
            Some(Arc::new(Mutex::new(Some(reader))))
        }
        // the predictions file `name`
        None => None,
    };
    let kept = Arc::new(Mutex::new(Vec::new()));
    let mut opts =
        pieval::ops::score::ScoreOptions::new(PathBuf::from(name), cases, output, run_id);
    opts.mitigation = mitigation;
    opts.leakage_threshold = leakage_threshold;
    opts.experiment_name = experiment_name;
    opts.predictions_batches = batches;
    opts.keep_results = Some(Arc::clone(&kept));
    let (report, batches) = interruptible(py, move || {
        let report = pieval::ops::score::score(&opts)?;
        let batches = std::mem::take(&mut *kept.lock().unwrap_or_else(|p| p.into_inner()));
        Ok((json(&report)?, batches))
    })?;
    // the first batch is the schema's (scoring keeps an empty one first)
    let schema = batches
        .first()
        .map(RecordBatch::schema)
        .ok_or_else(|| PyRuntimeError::new_err("scoring gave no schema"))?;
    Ok((ArrowStream::of(schema, batches), report))
}

/// A read-only query over run folders (`results`), a corpus and Arrow tables.
#[pyfunction]
#[pyo3(signature = (query, results, cases, tables = Vec::new(), memory_limit_mib = 4096))]
fn sql(
    py: Python<'_>,
    query: String,
    results: Option<PathBuf>,
    cases: PathBuf,
    tables: Vec<(String, Bound<'_, PyAny>)>,
    memory_limit_mib: usize,
) -> PyResult<ArrowStream> {
    let mut given = Vec::with_capacity(tables.len());
    for (name, obj) in &tables {
        let reader = import_stream(obj)?;
        let schema = reader.schema();
        // The table's batches, read in place (a stream is read once: the query may scan
        // a table more than once).
        let batches = py
            .detach(|| reader.collect::<Result<Vec<_>, _>>())
            .map_err(|e| to_py(py, Error::Arrow(e)))?;
        given.push((name.clone(), schema, batches));
    }
    let (schema, batches) = interruptible(py, move || {
        pieval::engine::runtime()?.block_on(pieval::engine::tables::query_read_only(
            &query,
            results.as_deref(),
            &cases,
            given,
            memory_limit_mib.checked_mul(1 << 20).ok_or_else(|| {
                Error::Usage(format!("memory_limit_mib {memory_limit_mib}: too large"))
            })?,
        ))
    })?;
    Ok(ArrowStream::of(schema, batches))
}

/// Run an experiment; the outcome (JSON). `progress(event, done, total, note)` is
/// called from pieval's thread with the GIL taken.
#[pyfunction]
#[pyo3(signature = (config, output_dir = None, sample_size = None, resume = None, taxonomy = PathBuf::from("data/taxonomy"), progress = None))]
fn run(
    py: Python<'_>,
    config: PathBuf,
    output_dir: Option<PathBuf>,
    sample_size: Option<usize>,
    resume: Option<String>,
    taxonomy: PathBuf,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let progress: Option<pieval::runner::Progress> = progress.map(|callback| {
        let callback = Arc::new(callback);
        Arc::new(move |event: pieval::runner::RunEvent<'_>| {
            use pieval::runner::RunEvent;
            let (kind, done, total, note) = match event {
                // setup notes may quote names from the config: escaped as on the terminal
                RunEvent::Note(line) => (
                    "note",
                    0,
                    0,
                    Some(pieval::text::escape_control(line).into_owned()),
                ),
                RunEvent::Calling { pending } => ("calling", 0, pending, None),
                RunEvent::CaseDone {
                    successes,
                    errors,
                    blocked,
                } => (
                    "case_done",
                    1,
                    0,
                    Some(format!(
                        "successes {successes} errors {errors} blocked {blocked}"
                    )),
                ),
                RunEvent::Interrupted => ("interrupted", 0, 0, None),
                RunEvent::CallsDone => ("calls_done", 0, 0, None),
            };
            let callback = Arc::clone(&callback);
            Python::attach(move |py| {
                // A progress callback that fails is said, not a reason to stop the run.
                if let Err(e) = callback.call1(py, (kind, done, total, note)) {
                    e.print(py);
                }
            });
        }) as pieval::runner::Progress
    });
    interruptible(py, move || {
        let opts = pieval::runner::RunOptions {
            config,
            sample_size,
            output_dir,
            resume,
            dry_run: false,
            progress,
            taxonomy,
        };
        json(&pieval::runner::run(&opts)?)
    })
}

/// Import another tool's results into a run folder; the import report (JSON).
#[pyfunction]
#[pyo3(signature = (tool, paths, output, replace = false, cases = Vec::new(), taxonomy = None, source_scorer = None, correct_means_attack = true, judge = None, trace_run = None, max_line_bytes = 64 << 20))]
#[allow(clippy::too_many_arguments)]
fn import_results(
    py: Python<'_>,
    tool: String,
    paths: Vec<PathBuf>,
    output: PathBuf,
    replace: bool,
    cases: Vec<PathBuf>,
    taxonomy: Option<PathBuf>,
    source_scorer: Option<String>,
    correct_means_attack: bool,
    judge: Option<PathBuf>,
    trace_run: Option<String>,
    max_line_bytes: usize,
) -> PyResult<String> {
    let command = std::iter::once("pieval.import_results".to_owned())
        .chain(std::iter::once(tool.clone()))
        .chain(paths.iter().map(|p| p.display().to_string()))
        .map(|a| pieval::text::escape_control(&a).into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let opts = pieval::import::ImportOptions {
        tool,
        paths,
        output,
        replace,
        source_scorer,
        correct_means_attack,
        judge,
        command,
        max_line_bytes,
        taxonomy,
        cases,
        trace_run,
    };
    interruptible(py, move || json(&pieval::import::import(&opts)?))
}

/// Verify signed envelopes; (all passed, the reports as JSON).
#[pyfunction]
#[pyo3(signature = (envelopes, public_key = None, run_dir = None, digest_only = false))]
fn verify(
    py: Python<'_>,
    envelopes: Vec<PathBuf>,
    public_key: Option<PathBuf>,
    run_dir: Option<PathBuf>,
    digest_only: bool,
) -> PyResult<(bool, String)> {
    interruptible(py, move || {
        let (ok, reports) = pieval::evidence::verify::verify_all(
            &envelopes,
            public_key.as_deref(),
            run_dir.as_deref(),
            digest_only,
        )?;
        Ok((ok, json(&reports)?))
    })
}

/// One of pieval's scalar functions, as DataFusion's FFI carries it to another build of
/// DataFusion (datafusion-python's: `datafusion.udf(this)`).
#[pyclass(module = "pieval._native", frozen)]
struct ScalarFunction {
    name: String,
    udf: Arc<datafusion::logical_expr::ScalarUDF>,
}

#[pymethods]
impl ScalarFunction {
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The function as a `datafusion_scalar_udf` capsule (DataFusion's FFI, major 55).
    #[pyo3(signature = (*_args))]
    fn __datafusion_scalar_udf__<'py>(
        &self,
        py: Python<'py>,
        _args: &Bound<'py, pyo3::types::PyTuple>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let ffi = datafusion_ffi::udf::FFI_ScalarUDF::from(Arc::clone(&self.udf));
        PyCapsule::new(py, ffi, Some(CString::new(UDF_CAPSULE).expect("no NUL")))
    }

    fn __repr__(&self) -> String {
        format!("<pieval scalar function {}>", self.name)
    }
}

/// pieval's scalar functions (those `pieval sql` adds to DataFusion's).
#[pyfunction]
fn scalar_functions() -> Vec<ScalarFunction> {
    use datafusion::execution::FunctionRegistry;
    let ctx = pieval::engine::session_with(datafusion::prelude::SessionConfig::new());
    pieval::engine::function_names()
        .into_iter()
        .filter_map(|name| {
            let udf = ctx.udf(&name).ok()?;
            Some(ScalarFunction { name, udf })
        })
        .collect()
}

/// The DataFusion version pieval is built with (its FFI's major must be the Python
/// `datafusion` package's).
#[pyfunction]
fn datafusion_version() -> &'static str {
    datafusion::DATAFUSION_VERSION
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<ArrowStream>()?;
    m.add_class::<ScalarFunction>()?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(score, m)?)?;
    m.add_function(wrap_pyfunction!(sql, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(import_results, m)?)?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(scalar_functions, m)?)?;
    m.add_function(wrap_pyfunction!(datafusion_version, m)?)?;
    Ok(())
}
