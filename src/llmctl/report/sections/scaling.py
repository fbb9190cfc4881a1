"""scaling: a `llmctl plan fit` of the lineage (its fit.json and plots): the law's constants with
their bootstrap intervals, how the starts agreed, the compute-optimal size at its budget, the
held-out run's predicted and measured loss, the runs it left out and why."""

from __future__ import annotations

import json
import shutil

from llmctl.report.collect import Artifact, Lineage
from llmctl.report.page import Figure, Section, Table
from llmctl.report.sections.common import Images, per_artifact

FIT_FILE = "fit.json"
PLOTS = {"isoflop.png": "IsoFLOP curves: loss against size per budget", "ladder.png": "L − Ê against compute, with the fitted frontier"}


def sections(lineage: Lineage, images: Images) -> list[Section]:
    return per_artifact(lineage.stage("plan fit"), "scaling", images, _fill)


def _fill(a: Artifact, s: Section, images: Images) -> None:
    try:
        r = json.loads((a.path / FIT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        s.notes.append(f"{a.path / FIT_FILE} is unreadable ({e}): no fit to show.")
        return
    p, iv, b = r["parametric"], r["bootstrap"]["intervals"], r["budget"]
    s.facts.update({"runs fitted": len(r["runs"]), "runs left out": len(r["excluded"]), "target": f"{r['target']} ({r['unit']})",
                    "starts at the best objective": f"{p['at_best']} of {p['starts']}", "their parameters agree": p["agree"],
                    "IsoFLOP N_opt ∝ C^a, a": r["isoflop"]["a"], "IsoFLOP D_opt ∝ C^b, b": r["isoflop"]["b"],
                    "budget C (FLOPs)": b["flops"], "N_opt at C": b["n_opt"], "D_opt at C": b["d_opt"]})
    rows = [[k, p[k], (iv.get(k) or {}).get("lo"), (iv.get(k) or {}).get("hi")] for k in ("E", "A", "B", "alpha", "beta")]
    s.tables.append(Table(["constant", "fit", "95% low", "95% high"], rows,
                          f"L = E + A/N^alpha + B/D^beta (Huber fit; bootstrap over runs, {r['bootstrap']['rounds']} rounds)"))
    if (h := r.get("holdout")) is not None:
        s.tables.append(Table(["held-out run", "parameters", "tokens", "predicted", "measured", "relative error"],
                              [[h["path"], h["n_params"], h["tokens"], h["predicted"], h["measured"], h["relative_error"]]],
                              "a run the fit never saw"))
    if r["excluded"]:
        s.tables.append(Table(["run", "why it is not a point"], [[e["path"], e["reason"]] for e in r["excluded"]], "runs left out"))
    s.notes += [f"warning of the fit: {w}" for w in r.get("warnings", [])]
    for name, caption in PLOTS.items():
        if (a.path / name).is_file():
            dest = images.folder(s.key) / name
            shutil.copyfile(a.path / name, dest)
            s.figures.append(Figure(images.rel(dest), caption))
