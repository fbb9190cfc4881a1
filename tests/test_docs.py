"""The docs artifact: Parquet and Arrow-stream round trips, foreign inputs (Arrow files,
save_to_disk folders), schema union, the dataset card."""

import gzip
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmctl.artifacts.card import CARD
from llmctl.artifacts.docs import open_docs_inputs, read_source, resolve_docs_inputs, row_count
from llmctl.artifacts.docs_write import DocsSink, ShardWriter
from llmctl.data.cat import CatConfig, run_cat
from llmctl.data.filter import FilterConfig, run_filter
from llmctl.runtime.options import RunOptions
from llmctl.errors import UsageError

ROWS = [
    {"id": "a", "text": "Grüße aus Köln — naïve café", "lang": "de", "score": 0.5},
    {"id": "b", "text": "日本語のテキスト 🚀", "lang": None, "score": None},
    {"id": "c", "text": "", "lang": "en", "score": 1.0},
    {"id": "d", "text": None, "lang": "xx", "score": -2.0},
]


def table():
    return pa.Table.from_pylist(ROWS)


def test_parquet_round_trip_keeps_unicode_nulls_and_unknown_columns(tmp_path):
    run_cat_input = tmp_path / "in.parquet"
    pq.write_table(table(), run_cat_input)
    run_cat([str(run_cat_input)], str(tmp_path / "out"), CatConfig())
    got = pq.read_table(tmp_path / "out" / "part-00000.parquet")
    assert got.to_pylist() == ROWS
    meta = pq.ParquetFile(tmp_path / "out" / "part-00000.parquet").metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"


def test_stream_round_trip(tmp_path):
    buf = io.BytesIO()
    sink = DocsSink("-", table().schema, stdout=buf)
    for b in table().to_batches(max_chunksize=3):
        sink.write(b)
    sink.close()
    buf.seek(0)
    docs = open_docs_inputs(["-"], stdin=buf)
    got = pa.Table.from_batches(list(docs.batches), schema=docs.schema)
    assert got.to_pylist() == ROWS


def test_jsonl_gz_without_id_gets_stable_derived_ids(tmp_path):
    p = tmp_path / "dump.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        for i in range(3):
            f.write(json.dumps({"text": f"doc {i} ✓", "url": f"http://x/{i}"}) + "\n")
    first = pa.Table.from_batches(list(open_docs_inputs([str(p)]).batches))
    again = pa.Table.from_batches(list(open_docs_inputs([str(p)]).batches))
    assert first.column("id").to_pylist() == ["dump.jsonl.gz/0", "dump.jsonl.gz/1", "dump.jsonl.gz/2"]
    assert first.equals(again)
    assert first.schema.names[:2] == ["id", "text"]


def test_directory_of_parquet_like_a_saved_hf_dataset(tmp_path):
    d = tmp_path / "hf" / "data"
    d.mkdir(parents=True)
    for i in range(2):
        pq.write_table(pa.table({"text": [f"t{i}a", f"t{i}b"], "label": [i, i]}), d / f"train-0000{i}-of-00002.parquet")
    sources = resolve_docs_inputs([str(tmp_path / "hf")])
    assert [s.label for s in sources] == ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]
    rows = pa.Table.from_batches(list(open_docs_inputs([str(tmp_path / "hf")]).batches)).to_pylist()
    assert [r["text"] for r in rows] == ["t0a", "t0b", "t1a", "t1b"]
    assert rows[3]["id"] == "data/train-00001-of-00002.parquet/1"


def test_union_of_columns_fills_missing_with_nulls(tmp_path):
    pq.write_table(pa.table({"id": ["1"], "text": ["x"], "a": [1]}), tmp_path / "one.parquet")
    pq.write_table(pa.table({"id": ["2"], "text": ["y"], "b": ["z"]}), tmp_path / "two.parquet")
    docs = open_docs_inputs([str(tmp_path / "one.parquet"), str(tmp_path / "two.parquet")])
    rows = pa.Table.from_batches(list(docs.batches)).to_pylist()
    assert rows == [{"id": "1", "text": "x", "a": 1, "b": None}, {"id": "2", "text": "y", "a": None, "b": "z"}]


def test_input_without_text_column_is_a_usage_error(tmp_path):
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "x.parquet")
    with pytest.raises(UsageError, match="no 'text' column"):
        list(open_docs_inputs([str(tmp_path / "x.parquet")]).batches)


def test_garbage_parquet_is_a_usage_error(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(UsageError, match="unreadable"):
        open_docs_inputs([str(tmp_path / "bad.parquet")])


def test_shard_writer_is_invisible_until_closed(tmp_path):
    w = ShardWriter(tmp_path / "part-00000.parquet", table().schema)
    w.write(table())
    assert not (tmp_path / "part-00000.parquet").exists()
    assert [p.name for p in tmp_path.iterdir()][0].startswith(".part-00000.parquet.tmp-")
    w.close()
    assert [p.name for p in tmp_path.iterdir()] == ["part-00000.parquet"]


def test_sink_rolls_parts_and_empty_output_is_still_an_artifact(tmp_path):
    m = run_cat([_write(tmp_path)], str(tmp_path / "out"), CatConfig(rows_per_part=3))
    assert [o["rows"] for o in m.outputs] == [3, 1]
    empty = run_cat([_write(tmp_path)], str(tmp_path / "empty"), CatConfig(limit=0))
    assert [o["rows"] for o in empty.outputs] == [0]
    assert pq.read_table(tmp_path / "empty" / "part-00000.parquet").schema.names[:2] == ["id", "text"]


def _write(tmp_path):
    p = tmp_path / "in.parquet"
    pq.write_table(table(), p)
    return str(p)


def _saved_layout(d, shards: list[tuple[str, list[str]]]):
    """What datasets' `Dataset.save_to_disk` writes, made with pyarrow alone: Arrow IPC stream
    files, dataset_info.json, and state.json listing the files in row order."""
    d.mkdir(parents=True)
    for name, texts in shards:
        t = pa.table({"text": texts, "n": list(range(len(texts)))})
        with pa.ipc.new_stream(d / name, t.schema) as w:
            w.write_table(t, max_chunksize=2)
    (d / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string", "_type": "Value"}}}))
    (d / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n, _ in shards], "_split": None}))
    return str(d)


def test_save_to_disk_folder_is_read_in_state_json_order(tmp_path):
    # state.json, not the file names, says the order (here the reverse of sorting)
    d = _saved_layout(tmp_path / "saved", [("data-00001-of-00002.arrow", ["c", "d", "e"]), ("data-00000-of-00002.arrow", ["a", "b"])])
    sources = resolve_docs_inputs([d])
    assert [(s.fmt, s.label) for s in sources] == [("arrow", "data-00001-of-00002.arrow"), ("arrow", "data-00000-of-00002.arrow")]
    assert [row_count(s) for s in sources] == [3, 2]
    rows = pa.Table.from_batches(list(open_docs_inputs([d]).batches)).to_pylist()
    assert [r["text"] for r in rows] == ["c", "d", "e", "a", "b"]
    assert rows[4] == {"id": "data-00000-of-00002.arrow/1", "text": "b", "n": 1}
    # batches are streamed no larger than asked; `columns` keeps id and text
    batches = list(read_source(sources[0], batch_rows=1, columns=[]))
    assert [b.num_rows for b in batches] == [1, 1, 1] and batches[0].schema.names == ["id", "text"]


def test_a_parent_folder_reads_saved_datasets_and_never_their_metadata_as_jsonl(tmp_path):
    _saved_layout(tmp_path / "hf" / "saved", [("data-00000-of-00001.arrow", ["s"])])
    pq.write_table(pa.table({"text": ["p"]}), tmp_path / "hf" / "train.parquet")
    (tmp_path / "hf" / "dataset_infos.json").write_text("{}")  # a hub snapshot's metadata
    sources = resolve_docs_inputs([str(tmp_path / "hf")])
    assert [s.label for s in sources] == ["train.parquet", "saved/data-00000-of-00001.arrow"]


def test_a_dataset_dict_folder_is_a_usage_error_naming_its_splits(tmp_path):
    d = tmp_path / "dd"
    _saved_layout(d / "train", [("data-00000-of-00001.arrow", ["a"])])
    _saved_layout(d / "test", [("data-00000-of-00001.arrow", ["b"])])
    (d / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(UsageError, match=r"DatasetDict \(splits: train, test\); give one split's folder"):
        resolve_docs_inputs([str(d)])
    assert len(resolve_docs_inputs([str(d / "test")])) == 1


def test_arrow_ipc_file_format_and_garbage(tmp_path):
    t = pa.table({"text": ["x", "y", "z"]})
    with pa.ipc.new_file(tmp_path / "f.arrow", t.schema) as w:
        w.write_table(t, max_chunksize=2)
    rows = pa.Table.from_batches(list(open_docs_inputs([str(tmp_path / "f.arrow")]).batches)).to_pylist()
    assert [r["id"] for r in rows] == ["f.arrow/0", "f.arrow/1", "f.arrow/2"]
    (tmp_path / "bad.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(UsageError, match="unreadable"):
        open_docs_inputs([str(tmp_path / "bad.arrow")])


def test_every_docs_artifact_gets_a_dataset_card(tmp_path):
    run_cat([_write(tmp_path)], str(tmp_path / "out"), CatConfig(rows_per_part=3))
    card = (tmp_path / "out" / CARD).read_text(encoding="utf-8")
    front = card.split("---\n")[1]
    assert 'config_name: default' in front and 'path: "part-*.parquet"' in front and "rejected" not in front
    assert "Kept: 4 documents" in card and str(tmp_path) not in card
    run_cat([_write(tmp_path)], str(tmp_path / "again"), CatConfig(rows_per_part=3))
    assert (tmp_path / "again" / CARD).read_text(encoding="utf-8") == card  # no time, no path: same run, same bytes
    assert not list((tmp_path / "out").glob(".*tmp*"))
    run_cat([_write(tmp_path)], str(tmp_path / "empty"), CatConfig(limit=0))
    assert "Kept: 0 documents" in (tmp_path / "empty" / CARD).read_text(encoding="utf-8")
    assert "refuses a split without rows" in (tmp_path / "empty" / CARD).read_text(encoding="utf-8")


def test_a_resumed_stage_finishes_its_card_with_the_manifest(tmp_path):
    out = tmp_path / "f"
    cfg = FilterConfig(steps=[{"name": "pii"}])
    run_filter([_write(tmp_path)], str(out), cfg, RunOptions(workers=1))
    card = (out / CARD).read_bytes()
    (out / "manifest.json").unlink()  # killed after the card, before the manifest
    run_filter([_write(tmp_path)], str(out), cfg, RunOptions(workers=1))
    assert (out / "manifest.json").is_file() and (out / CARD).read_bytes() == card
    (out / CARD).unlink()  # a finished artifact re-run into (or one made before cards): the card comes back
    run_filter([_write(tmp_path)], str(out), cfg, RunOptions(workers=1))
    assert (out / CARD).read_bytes() == card
    run_filter([_write(tmp_path)], str(out), cfg, RunOptions(workers=1, overwrite=True))
    assert (out / CARD).read_bytes() == card
