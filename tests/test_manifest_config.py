"""Manifests, lineage, and config precedence."""

import json
from dataclasses import dataclass, field

import pytest

from llmctl.artifacts.manifest import Manifest, input_ref, lineage, read_manifest, write_manifest
from llmctl.config import build_config
from llmctl.errors import UsageError


def test_manifest_round_trip_and_lineage_back_to_raw_input(tmp_path):
    raw = tmp_path / "crawl.warc.gz"
    raw.write_bytes(b"raw bytes")
    a = tmp_path / "a"
    a.mkdir()
    write_manifest(a, Manifest(kind="docs", stage="crawl-extract", inputs=[input_ref(raw)], counts={"out": 3}))
    b = tmp_path / "b"
    b.mkdir()
    write_manifest(b, Manifest(kind="docs", stage="filter", inputs=[input_ref(a)], config={"k": 1}))
    m = read_manifest(b)
    assert m.kind == "docs" and m.config == {"k": 1} and m.llmctl_version and m.created
    tree = lineage(b)
    assert tree["stage"] == "filter"
    (child,) = tree["inputs"]
    assert child["stage"] == "crawl-extract" and child["changed"] is False
    (leaf,) = child["inputs"]
    assert leaf["kind"] == "file" and leaf["changed"] is False and leaf["bytes"] == 9
    raw.write_bytes(b"tampered!")
    assert lineage(b)["inputs"][0]["inputs"][0]["changed"] is True
    write_manifest(a, Manifest(kind="docs", stage="crawl-extract", inputs=[]))
    assert lineage(b)["inputs"][0]["changed"] is True


@dataclass
class Cfg:
    languages: list[str] = field(default_factory=lambda: ["en"])
    threshold: float = 0.65
    fast: bool = False
    name: str = "x"
    block_file: str | None = None


def test_config_precedence_defaults_then_toml_then_flags(tmp_path):
    toml = tmp_path / "stages" / "demo" / "mine.toml"
    toml.parent.mkdir(parents=True)
    toml.write_text('threshold = 1\nfast = true\nblock_file = "lists/block.txt"\n')
    cfg = build_config(Cfg, "demo", str(toml), {"fast": None, "name": "flag"})
    assert cfg == Cfg(threshold=1.0, fast=True, name="flag", block_file=str(tmp_path / "stages/demo/lists/block.txt"))
    cfg = build_config(Cfg, "demo", str(toml), {"fast": False, "languages": "en,de"})
    assert cfg.fast is False and cfg.languages == ["en", "de"]
    assert build_config(Cfg, "demo") == Cfg()


def test_named_config_is_found_under_stages(tmp_path, monkeypatch):
    (tmp_path / "stages" / "demo").mkdir(parents=True)
    (tmp_path / "stages" / "demo" / "fineweb.toml").write_text("threshold = 0.9\n")
    monkeypatch.chdir(tmp_path)
    assert build_config(Cfg, "demo", "fineweb").threshold == 0.9
    with pytest.raises(UsageError, match="no config named 'nope'"):
        build_config(Cfg, "demo", "nope")


@pytest.mark.parametrize(
    "text, message",
    [("bogus = 1\n", "unknown key"), ('threshold = "high"\n', "expected float"), ("threshold = \n", "invalid TOML")],
)
def test_bad_config_files_are_usage_errors(tmp_path, text, message):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(UsageError, match=message):
        build_config(Cfg, "demo", str(p))
