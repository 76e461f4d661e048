"""pieval: prompt-injection evaluation on Arrow, Parquet and DataFusion, from Python.

The functions here are pieval's own (the same code as the ``pieval`` command, which this
package installs too), Arrow-native: tables go in as pyarrow, pandas or polars data (or
anything exporting an Arrow C stream, ``__arrow_c_stream__``) and come back as
``pyarrow.Table``. A pyarrow table is read where it is: its text is not copied on the
way in, and the results are pieval's buffers handed over as they are.

- :func:`score` scores predictions against a corpus of attack cases;
- :func:`sql` runs a read-only query over run folders and tables;
- :func:`detect` runs pieval's detectors over texts;
- :func:`run` runs an experiment (a model or an application under attack);
- :func:`import_results` reads another tool's results (garak, Inspect, promptfoo, …);
- :func:`verify` checks signed evidence;
- :func:`register` adds pieval's SQL functions to a ``datafusion.SessionContext``.

Errors are :class:`pieval.errors.PievalError` (the file, line and field as attributes);
Ctrl-C stops the work under way and raises ``KeyboardInterrupt``, leaving nothing
half-written. docs/python.md is the reference.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

import pyarrow as pa

from . import _native
from .errors import (
    ConfigError,
    EvidenceError,
    InputError,
    NotFoundError,
    PievalError,
    PievalIOError,
    QueryError,
    UsageError,
)

__version__: str = _native.__version__

__all__ = [
    "score",
    "sql",
    "detect",
    "run",
    "import_results",
    "verify",
    "register",
    "RunResult",
    "ImportResult",
    "VerifyResult",
    "DETECTORS",
    "DATAFUSION_MAJOR",
    "PievalError",
    "InputError",
    "ConfigError",
    "PievalIOError",
    "UsageError",
    "NotFoundError",
    "QueryError",
    "EvidenceError",
]

#: The DataFusion major pieval is built with: :func:`register` needs the PyPI
#: ``datafusion`` package of the same major (DataFusion's FFI is stable within one).
DATAFUSION_MAJOR: int = int(_native.datafusion_version().split(".")[0])

PathLike = Union[str, "os.PathLike[str]"]
#: Tabular data: a pyarrow Table, RecordBatch or RecordBatchReader, a pandas or polars
#: DataFrame, a list of dicts, or any object with ``__arrow_c_stream__``.
TableLike = Any

# The CLI's default corpus, relative to the working folder (docs/cli.md).
_ENRICHED = Path("data/normalized/attack_cases.enriched.jsonl")
_CORPUS = Path("data/normalized/attack_cases.jsonl")


def _arrow(data: TableLike, what: str) -> Any:
    """An object exporting an Arrow C stream, for ``data``; no copy for Arrow data."""
    if isinstance(data, (pa.Table, pa.RecordBatchReader)):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    module = type(data).__module__.split(".")[0]
    if module == "pandas":
        # The index is not a column of pieval's contract.
        return pa.Table.from_pandas(data, preserve_index=False)
    if module == "polars":
        return data.to_arrow()
    if hasattr(data, "__arrow_c_stream__"):
        return data
    if isinstance(data, Mapping):
        return pa.table(dict(data))
    if isinstance(data, list) and all(isinstance(r, Mapping) for r in data):
        return pa.Table.from_pylist(data)
    raise TypeError(
        f"{what}: expected a pyarrow, pandas or polars table (or an object with "
        f"__arrow_c_stream__), not {type(data).__name__}"
    )


def _default_cases() -> Path:
    return _ENRICHED if _ENRICHED.exists() else _CORPUS


def _with_cases(cases: Union[PathLike, TableLike, None], scratch: List[Path]) -> Path:
    """The corpus as a file pieval reads (a table is written to Parquet in ``scratch``)."""
    if cases is None:
        return _default_cases()
    if isinstance(cases, (str, os.PathLike)):
        return Path(cases)
    table = _arrow(cases, "cases")
    if not isinstance(table, pa.Table):
        table = pa.table(table)
    # As JSONL, which the corpus reader validates record by record against the contract
    # (docs/contract.md): a nested column (success_criteria, provenance) is an object.
    folder = Path(tempfile.mkdtemp(prefix="pieval-cases-"))
    scratch.append(folder)
    path = folder / "attack_cases.jsonl"
    def not_json(value: Any) -> Any:
        if isinstance(value, (bytes, bytearray)):
            raise TypeError("a binary value (the contract's fields are text)")
        return str(value)  # dates and times, as their ISO text

    with path.open("w", encoding="utf-8") as out:
        row_no = 0
        for batch in table.to_batches():
            for row in batch.to_pylist():
                row_no += 1
                try:
                    line = json.dumps(
                        _without_nulls(row), ensure_ascii=False, allow_nan=False, default=not_json
                    )
                except (TypeError, ValueError) as e:
                    raise InputError(f"cases (a table):{row_no}: {e}", line=row_no) from None
                out.write(line)
                out.write("\n")
    return path


def _without_nulls(value: Any) -> Any:
    """A record with its null fields left out, nested ones too: a table gives every row
    each field any row has (a struct column's too), which a JSON record only has when
    set."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def score(
    predictions: Union[TableLike, PathLike],
    cases: Union[PathLike, TableLike, None] = None,
    *,
    output: Optional[PathLike] = None,
    run_id: Optional[str] = None,
    mitigation: Optional[str] = None,
    leakage_threshold: float = 0.5,
    experiment_name: Optional[str] = None,
) -> pa.Table:
    """Score predictions against a corpus of attack cases, as ``pieval score`` does.

    ``predictions`` has the contract's prediction columns (``case_id``,
    ``response_text``, …; docs/contract.md): a table, or a predictions file (JSONL or
    Parquet). ``cases`` is the corpus: a file, a table, or by default the CLI's
    (``data/normalized/attack_cases*.jsonl`` under the working folder).

    Returns ``case_results`` (one row per prediction: the decision, the detectors'
    fields, the review reason). The score report (the counts and aggregate metrics of
    ``summary.json``) is in the schema's metadata under ``b"pieval.score_report"``.
    With ``output`` the run folder is written there (case_results, findings, summary);
    without, it is written to a temporary folder and removed.

    Raises :class:`InputError` naming the row and field of the first bad value.
    """
    scratch: List[Path] = []
    try:
        corpus = _with_cases(cases, scratch)
        if output is None:
            folder = Path(tempfile.mkdtemp(prefix="pieval-score-"))
            scratch.append(folder)
        else:
            folder = Path(output)
        run_id = run_id or "score-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        if isinstance(predictions, (str, os.PathLike)):
            stream, name = None, os.fspath(predictions)
        else:
            stream, name = _arrow(predictions, "predictions"), "predictions (a table)"
        results, report = _native.score(
            stream,
            name,
            os.fspath(corpus),
            os.fspath(folder),
            run_id,
            mitigation,
            float(leakage_threshold),
            experiment_name,
        )
        table = pa.RecordBatchReader.from_stream(results).read_all()
        metadata = dict(table.schema.metadata or {})
        metadata[b"pieval.score_report"] = report.encode()
        return table.replace_schema_metadata(metadata)
    finally:
        for folder in scratch:
            shutil.rmtree(folder, ignore_errors=True)


def score_report(table: pa.Table) -> Dict[str, Any]:
    """The score report :func:`score` put in its table's metadata."""
    raw = (table.schema.metadata or {}).get(b"pieval.score_report")
    if raw is None:
        raise KeyError("this table carries no pieval score report")
    return json.loads(raw)


def sql(
    query: str,
    results: Optional[PathLike] = None,
    *,
    cases: Optional[PathLike] = None,
    tables: Optional[Mapping[str, TableLike]] = None,
    memory_limit_mib: int = 4096,
) -> pa.Table:
    """A read-only SQL query, as ``pieval sql`` runs it.

    ``results`` is a folder of run folders (``results/``): its standard tables
    (``case_results``, ``findings``, ``summaries``, ``runs``, …; docs/cli.md) are there,
    with ``attack_cases`` from ``cases`` (default: the CLI's corpus, when it exists).
    ``tables`` adds tables of your own by name. pieval's SQL functions (``pi_detect``,
    ``pi_decide``, ``pi_wilson_low``, …) are registered.
    """
    given = [(name, _arrow(t, f"table {name}")) for name, t in (tables or {}).items()]
    stream = _native.sql(
        query,
        None if results is None else os.fspath(results),
        os.fspath(_default_cases() if cases is None else cases),
        given,
        int(memory_limit_mib),
    )
    return pa.RecordBatchReader.from_stream(stream).read_all()


#: The detectors :func:`detect` runs, and the SQL each one is (``{role}`` and
#: ``{system_prompt}`` are filled in by :func:`detect`).
DETECTORS: Dict[str, str] = {
    "refusal": "pi_refusal(text)",
    "response_class": "pi_response_class(text)",
    "rule_hits": "pi_rule_hits(text)",
    "rule_spans": "pi_rule_spans(text)",
    "injection_score": "pi_injection_score(text, {role})",
    "leakage_score": "pi_leakage_score(text, {system_prompt})",
    "leaked": "pi_leakage(text, {system_prompt})",
}


def detect(
    texts: Union[Sequence[Optional[str]], TableLike],
    detectors: Iterable[str] = ("refusal", "response_class", "rule_hits", "injection_score"),
    *,
    system_prompt: Union[str, Sequence[Optional[str]], None] = None,
    role: str = "user_prompt",
) -> pa.Table:
    """Run pieval's detectors over texts: one row per text, one column per detector.

    ``texts`` is a list, a pyarrow array, or a pandas or polars Series of strings.
    Detectors (:data:`DETECTORS`): ``refusal``, ``response_class``, ``rule_hits``,
    ``rule_spans``, ``injection_score`` (of the text in ``role``: ``user_prompt``,
    ``retrieved_document`` or ``tool_output``), and with ``system_prompt`` (one for all
    texts, or one per text) ``leakage_score`` and ``leaked``.
    """
    chosen = list(detectors)
    unknown = [d for d in chosen if d not in DETECTORS]
    if unknown:
        raise UsageError(
            f"unknown detector(s) {', '.join(unknown)}; known: {', '.join(DETECTORS)}"
        )
    needs_prompt = [d for d in chosen if "{system_prompt}" in DETECTORS[d]]
    if needs_prompt and system_prompt is None:
        raise UsageError(f"{', '.join(needs_prompt)} need(s) system_prompt")
    column = _text_array(texts, "texts")
    columns: Dict[str, Any] = {"text": column}
    prompt_sql = "system_prompt"
    if system_prompt is not None:
        if isinstance(system_prompt, str):
            # one prompt for all texts: a literal, not a column of copies
            prompt_sql = _sql_string(system_prompt)
        else:
            prompts = _text_array(system_prompt, "system_prompt")
            if len(prompts) != len(column):
                raise UsageError(
                    f"system_prompt has {len(prompts)} value(s) for {len(column)} text(s)"
                )
            columns["system_prompt"] = prompts
    table = pa.table(columns)
    select = ", ".join(
        DETECTORS[d].format(role=_sql_string(role), system_prompt=prompt_sql) + f" AS {d}"
        for d in chosen
    )
    return sql(f"SELECT text, {select} FROM texts", tables={"texts": table})


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _text_array(values: Any, what: str) -> Union[pa.Array, pa.ChunkedArray]:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        array = values
    elif type(values).__module__.split(".")[0] in ("pandas", "polars"):
        array = pa.array(values.to_arrow() if hasattr(values, "to_arrow") else values)
    else:
        array = pa.array(list(values), pa.string())
    if pa.types.is_large_string(array.type) or pa.types.is_string_view(array.type):
        array = array.cast(pa.string())
    if not pa.types.is_string(array.type):
        raise TypeError(f"{what}: expected strings, not {array.type}")
    return array


class _RunFolder:
    """The tables of a run folder (``dir``)."""

    @property
    def dir(self) -> Path:
        raise NotImplementedError

    def table(self, name: str = "case_results") -> pa.Table:
        """One of the run's Parquet tables (``case_results``, ``findings``, ``turns``, …)."""
        import pyarrow.parquet as pq

        path = self.dir / f"{name}.parquet"
        if not path.is_file():
            raise NotFoundError(f"{path}: the run has no {name} table", path=str(path))
        return pq.read_table(path)

    @property
    def case_results(self) -> pa.Table:
        return self.table("case_results")


@dataclass
class RunResult(_RunFolder):
    """What :func:`run` did: the outcome ``pieval run --json`` prints, and the run."""

    #: ``pieval run --json``'s document: the status, counts, speed and score report.
    outcome: Dict[str, Any]

    @property
    def run_id(self) -> str:
        return str(self.outcome["run_id"])

    @property
    def dir(self) -> Path:
        """The run folder."""
        return Path(self.outcome["dir"])

    @property
    def status(self) -> Any:
        return self.outcome["status"]


    @property
    def metrics(self) -> Dict[str, Any]:
        """``summary.json``'s aggregate metrics (rates with their Wilson intervals)."""
        return (self.outcome.get("score") or {}).get("aggregate_metrics", {})


class _Progress:
    """The default progress of :func:`run`: setup notes, then the model calls' count,
    on ``sys.stderr`` (in a notebook, the cell's output) at most every two seconds."""

    def __init__(self) -> None:
        self.total = 0
        self.done = 0
        self.shown = 0.0
        self.status = ""

    def __call__(self, event: str, done: int, total: int, note: Optional[str]) -> None:
        now = time.monotonic()
        if event == "note" and note:
            print(note, file=sys.stderr, flush=True)
        elif event == "calling":
            self.total, self.done, self.shown = total, 0, now
            print(f"calling the model: {total} case(s)", file=sys.stderr, flush=True)
        elif event == "case_done":
            self.done += done
            self.status = note or ""
            if now - self.shown >= 2.0 or self.done == self.total:
                self.shown = now
                print(
                    f"  {self.done}/{self.total} case(s)  {self.status}",
                    file=sys.stderr,
                    flush=True,
                )
        elif event == "interrupted":
            print("interrupted", file=sys.stderr, flush=True)


def run(
    config: PathLike,
    *,
    output_dir: Optional[PathLike] = None,
    sample_size: Optional[int] = None,
    resume: Optional[str] = None,
    taxonomy: PathLike = "data/taxonomy",
    progress: Union[bool, Callable[[str, int, int, Optional[str]], None]] = True,
) -> RunResult:
    """Run an experiment, as ``pieval run CONFIG`` does; paths in the config are read
    from the working folder, as the command reads them.

    ``progress``: ``True`` shows the setup notes and the model calls' count on
    ``sys.stderr``; ``False`` nothing; a callable ``(event, done, total, note)`` gets
    the events (``note``, ``calling``, ``case_done``, ``calls_done``, ``interrupted``).
    Ctrl-C stops calling the model, keeps what is done (``resume=`` continues it) and
    raises ``KeyboardInterrupt``.
    """
    callback = _Progress() if progress is True else (progress or None)
    outcome = _native.run(
        os.fspath(config),
        None if output_dir is None else os.fspath(output_dir),
        sample_size,
        resume,
        os.fspath(taxonomy),
        callback,
    )
    return RunResult(json.loads(outcome))


@dataclass
class ImportResult(_RunFolder):
    """What :func:`import_results` wrote: its report and the run folder."""

    report: Dict[str, Any]

    @property
    def dir(self) -> Path:
        return Path(self.report["output"])



def import_results(
    tool: str,
    path: Union[PathLike, Sequence[PathLike]],
    *,
    output: PathLike,
    replace: bool = False,
    cases: Sequence[PathLike] = (),
    taxonomy: Optional[PathLike] = None,
    source_scorer: Optional[str] = None,
    correct_means: str = "attack",
    judge: Optional[PathLike] = None,
    trace_run: Optional[str] = None,
    max_line_bytes: int = 64 << 20,
) -> ImportResult:
    """Import another tool's results into a pieval run folder and score them, as
    ``pieval import TOOL PATH --output DIR`` does (docs/import.md: garak, PyRIT,
    promptfoo, Inspect, AgentDojo, InjecAgent, OpenTelemetry traces)."""
    if correct_means not in ("attack", "defence"):
        raise UsageError("correct_means: 'attack' or 'defence'")
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if taxonomy is None and Path("data/taxonomy").exists():
        taxonomy = "data/taxonomy"
    report = _native.import_results(
        tool,
        [os.fspath(p) for p in paths],
        os.fspath(output),
        replace,
        [os.fspath(c) for c in cases],
        None if taxonomy is None else os.fspath(taxonomy),
        source_scorer,
        correct_means == "attack",
        None if judge is None else os.fspath(judge),
        trace_run,
        max_line_bytes,
    )
    return ImportResult(json.loads(report))


@dataclass
class VerifyResult:
    """What :func:`verify` found: whether everything passed, and one report per
    envelope (and per controls index) checked."""

    ok: bool
    reports: List[Dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok


def verify(
    envelopes: Union[PathLike, Sequence[PathLike]],
    *,
    public_key: Optional[PathLike] = None,
    run_dir: Optional[PathLike] = None,
    digest_only: bool = False,
) -> VerifyResult:
    """Verify signed evidence, as ``pieval verify`` does: each envelope's signature with
    ``public_key`` and each file it names against its digest. Without a key nothing is
    authenticated, and that passes only with ``digest_only=True``."""
    paths = [envelopes] if isinstance(envelopes, (str, os.PathLike)) else list(envelopes)
    ok, reports = _native.verify(
        [os.fspath(p) for p in paths],
        None if public_key is None else os.fspath(public_key),
        None if run_dir is None else os.fspath(run_dir),
        digest_only,
    )
    return VerifyResult(ok, json.loads(reports))


def register(ctx: Any) -> List[str]:
    """Register pieval's SQL functions (``pi_detect``, ``pi_decide``, ``pi_refusal``,
    ``pi_wilson_low``, …) in a ``datafusion.SessionContext`` of PyPI's ``datafusion``,
    through DataFusion's FFI; their names. The package must be of DataFusion major
    :data:`DATAFUSION_MAJOR` (``pip install 'pieval[datafusion]'``)."""
    import datafusion

    major = int(datafusion.__version__.split(".")[0])
    if major != DATAFUSION_MAJOR:
        raise UsageError(
            f"datafusion {datafusion.__version__} is installed; pieval's functions need "
            f"the DataFusion major it is built with, {DATAFUSION_MAJOR} "
            f"(pip install 'datafusion>={DATAFUSION_MAJOR},<{DATAFUSION_MAJOR + 1}')"
        )
    names = []
    for function in _native.scalar_functions():
        ctx.register_udf(datafusion.udf(function))
        names.append(function.name)
    return names
