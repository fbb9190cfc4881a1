"""dedup: removals by method, the cluster-size histogram and the S-curve of the banding used, from
the dedup manifest (the figures are data/dedup/plots.py's, drawn from the same counts)."""

from __future__ import annotations

import re

from llmctl.data.dedup.plots import write_plots
from llmctl.data.dedup.spans import length_buckets, top_spans
from llmctl.report.collect import Artifact, Lineage
from llmctl.report.page import Figure, Section, Table
from llmctl.report.sections.common import Images, per_artifact, per_second


METHODS = ("url", "exact", "lines", "minhash", "semantic")  # the order data/dedup/run.py applies them
SPAN_METHODS = ("substring", "sentences")  # then these, inside the survivors (data/dedup/spans.py)


def size_order(bucket: str) -> float:
    """Cluster-size buckets ("1", "3-5", ">100") by their smallest size: manifests store JSON keys sorted
    as text, where "11-100" comes before "2"."""
    m = re.search(r"\d+", bucket)
    return int(m.group()) + (0.5 if bucket.startswith(">") else 0) if m else float("inf")


def sections(lineage: Lineage, images: Images) -> list[Section]:
    return per_artifact(lineage.stage("dedup"), "dedup", images, _fill)


def _fill(a: Artifact, s: Section, images: Images) -> None:
    m, c = a.manifest, a.manifest.counts
    s.facts = {
        "documents in": c.get("in"),
        "documents out": c.get("out"),
        "errors": c.get("errors"),
        "wall seconds": m.wall_seconds,
        "documents / s": per_second(c.get("in"), m.wall_seconds),
    }
    ranked = sorted((c.get("removed") or {}).items(), key=lambda kv: (METHODS.index(kv[0]) if kv[0] in METHODS else len(METHODS), kv[0]))
    removed = [[method, r.get("docs"), r.get("chars")] for method, r in ranked]
    if m.config.get("lines"):  # frequent lines cut out of the documents kept
        s.facts.update({"frequent lines removed": (c.get("lines") or {}).get("removed"),
                        "their characters": (c.get("lines") or {}).get("chars")})
    s.tables.append(Table(["method", "documents removed", "characters removed"], removed, "removals by method, in the order they ran"))
    _spans(c.get("spans"), s)
    sc = c.get("s_curve")
    clusters = dict(sorted((c.get("clusters") or {}).items(), key=lambda kv: size_order(kv[0])))
    if clusters:
        s.tables.append(Table(["cluster size", "clusters"], [[k, v] for k, v in clusters.items()], "near-duplicate clusters by size"))
    if sc:
        s.facts.update({"MinHash bands": sc["bands"], "rows per band": sc["rows"], "threshold (J at P = 0.5)": sc["threshold"]})
        s.tables.append(Table(["Jaccard similarity", "P(flagged)"], [[float(j), p] for j, p in sc["p_flag"].items()],
                              f"the S-curve 1 - (1 - J^{sc['rows']})^{sc['bands']} of the banding used"))
        for path in write_plots({**c, "clusters": clusters}, sc["bands"], sc["rows"], str(images.folder(s.key))):
            s.figures.append(Figure(images.rel(path), "MinHash LSH S-curve" if path.name == "s_curve.png" else "duplicate clusters by size"))
    else:
        s.notes.append("No MinHash in this run: no S-curve and no clusters.")


def _spans(spans: dict | None, s: Section) -> None:
    """The span table: what --substring / --sentences cut, by length, and the most repeated cuts."""
    if not spans:
        return
    rows = [[m, v["docs_cut"], v["spans"], v["bytes"], round(100 * v["bytes"] / max(1, spans["bytes_in"]), 2)] for m, v in spans.items() if m in SPAN_METHODS]
    s.tables.append(Table(["method", "documents cut", "spans cut", "bytes cut", "% of bytes in"], rows, "spans cut inside the surviving documents"))
    s.facts["documents dropped as too short after the cut"] = spans.get("docs_dropped_short")
    s.tables.append(Table(["span length (bytes)", "spans"], [[k, v] for k, v in length_buckets(spans)], "cut spans by length"))
    top = top_spans(spans, 10)
    if top:
        s.tables.append(Table(["copies cut", "span (its first 120 bytes)"], [[n, t] for t, n in top], "the most repeated cut spans"))
