"""`llmctl filter stats`: per-statistic histograms and summary of an annotated docs artifact."""

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmctl.artifacts.manifest import Manifest, output_entry, write_manifest
from llmctl.data.filter_stats import bin_edges, write_histograms
from llmctl.errors import UsageError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NAN = float("nan")


def annotated_artifact(path, columns: dict):
    """A docs artifact as `filter --annotate-only` writes it: one part plus a manifest."""
    path.mkdir()
    n = len(next(iter(columns.values())))
    table = pa.table({"id": [f"d{i}" for i in range(n)], "text": [f"text {i}" for i in range(n)], **columns})
    pq.write_table(table, path / "part-00000.parquet")
    outputs = [output_entry(path / "part-00000.parquet", n, path)]
    write_manifest(path, Manifest(kind="docs", stage="filter", outputs=outputs, counts={"in": n, "out": n}))
    return path


@pytest.fixture
def artifact(tmp_path):
    # Rows 0-3 fail gopher_quality.n_words (< 50), row 4 fails fineweb.line_punct_ratio; 5-9 pass.
    reason = ["gopher_quality.n_words"] * 4 + ["fineweb.line_punct_ratio"] + [None] * 5
    return annotated_artifact(
        tmp_path / "annotated",
        {
            "stats.gopher_quality.n_words": pa.array([10, 20, 30, 40, 50, 60, 70, 80, 90, 100], pa.float64()),
            "stats.gopher_quality.stop_words": pa.array([0, 1, 2, 3, 4, 5, 6, 7, 8, None], pa.float64()),
            "stats.fineweb.line_punct_ratio": pa.array([NAN, 0.5, 0.5, 0.5, 0.05, 0.2, 0.4, 0.6, 0.8, 1.0]),
            "reason": pa.array(reason, pa.string()),
            "url": [f"http://x/{i}" for i in range(10)],  # other columns are ignored
        },
    )


def test_writes_one_valid_png_per_statistic(artifact, tmp_path):
    paths = write_histograms([str(artifact)], str(tmp_path / "plots"))
    assert [p.name for p in paths] == [
        "gopher_quality.n_words.png",
        "gopher_quality.stop_words.png",
        "fineweb.line_punct_ratio.png",
    ]
    for p in paths:
        assert p.read_bytes()[:8] == PNG_SIGNATURE and p.stat().st_size > 5_000


def test_summary_numbers(artifact, tmp_path):
    write_histograms([str(artifact)], str(tmp_path / "plots"))
    s = json.loads((tmp_path / "plots" / "summary.json").read_text())
    assert s["documents"] == 10 and s["rejected"] == 5
    words = s["statistics"]["gopher_quality.n_words"]
    assert (words["n"], words["n_nan"], words["rejected_here"]) == (10, 0, 4)
    assert words["kept"]["quantiles"]["min"] == 60 and words["kept"]["quantiles"]["max"] == 100
    assert words["kept"]["quantiles"]["p50"] == 80
    assert words["rejected"]["quantiles"]["p50"] == 30
    assert words["rejected"]["quantiles"]["p25"] == 20  # numpy's linear interpolation
    stops = s["statistics"]["gopher_quality.stop_words"]
    assert stops["n_nan"] == 1 and stops["kept"]["n_nan"] == 1 and stops["rejected"]["n_nan"] == 0
    assert stops["kept"]["quantiles"]["max"] == 8  # the null is left out, not read as 0
    punct = s["statistics"]["fineweb.line_punct_ratio"]
    assert punct["rejected_here"] == 1 and punct["rejected"]["n_nan"] == 1
    assert punct["rejected"]["quantiles"]["min"] == 0.05
    assert math.isclose(punct["kept"]["quantiles"]["p50"], 0.6)


def test_all_nan_statistic_and_no_reason_column(tmp_path):
    art = annotated_artifact(tmp_path / "a", {"stats.c4.curly": pa.array([NAN, NAN])})
    (png,) = write_histograms([str(art)], str(tmp_path / "plots"))
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    s = json.loads((tmp_path / "plots" / "summary.json").read_text())["statistics"]["c4.curly"]
    assert s["kept"]["n"] == 2 and s["kept"]["n_nan"] == 2 and s["kept"]["quantiles"]["p50"] is None


def test_bins_one_per_integer_for_counts_and_log_spaced_for_wide_ranges():
    edges, log_x = bin_edges(np.array([0.0, 1, 2, 8]), 50)
    assert list(edges) == [-0.5 + i for i in range(10)] and not log_x
    edges, log_x = bin_edges(np.array([1.5, 100_000.0]), 50)
    assert log_x and math.isclose(edges[0], 1.5) and math.isclose(edges[-1], 100_000)


def test_input_without_stats_columns_is_a_usage_error(tmp_path):
    plain = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["hello"], "reason": [None]}), plain)
    with pytest.raises(UsageError, match="annotate-only"):
        write_histograms([str(plain)], str(tmp_path / "plots"))
    assert not (tmp_path / "plots").exists()
