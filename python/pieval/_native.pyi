# Types of the extension module (crates/pieval-py/src/lib.rs). Call the functions of
# `pieval` (python/pieval/__init__.py), not these.
from typing import Any, Callable, List, Optional, Sequence, Tuple

__version__: str

class ArrowStream:
    """Record batches as an Arrow C stream, read once."""

    def __arrow_c_stream__(self, requested_schema: Optional[object] = None) -> object: ...

class ScalarFunction:
    """One of pieval's SQL functions, for DataFusion's FFI."""

    @property
    def name(self) -> str: ...
    def __datafusion_scalar_udf__(self, *args: Any) -> object: ...

def cli(argv: List[str]) -> int: ...
def score(
    predictions: Optional[object],
    name: str,
    cases: str,
    output: str,
    run_id: str,
    mitigation: Optional[str] = None,
    leakage_threshold: float = 0.5,
    experiment_name: Optional[str] = None,
) -> Tuple[ArrowStream, str]: ...
def sql(
    query: str,
    results: Optional[str],
    cases: str,
    tables: Sequence[Tuple[str, object]] = (),
    memory_limit_mib: int = 4096,
) -> ArrowStream: ...
def run(
    config: str,
    output_dir: Optional[str] = None,
    sample_size: Optional[int] = None,
    resume: Optional[str] = None,
    taxonomy: str = "data/taxonomy",
    progress: Optional[Callable[[str, int, int, Optional[str]], None]] = None,
) -> str: ...
def import_results(
    tool: str,
    paths: List[str],
    output: str,
    replace: bool = False,
    cases: List[str] = ...,
    taxonomy: Optional[str] = None,
    source_scorer: Optional[str] = None,
    correct_means_attack: bool = True,
    judge: Optional[str] = None,
    trace_run: Optional[str] = None,
    max_line_bytes: int = ...,
) -> str: ...
def verify(
    envelopes: List[str],
    public_key: Optional[str] = None,
    run_dir: Optional[str] = None,
    digest_only: bool = False,
) -> Tuple[bool, str]: ...
def scalar_functions() -> List[ScalarFunction]: ...
def datafusion_version() -> str: ...
