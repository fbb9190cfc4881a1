"""What a generative gain is made of (`llmctl eval compare A B`, issue 34): format or content, and
how it changes with the number of tries.

A reviewer's first question about an RL result is whether the model learned the task or the
answer format (verl's own GSM8K log climbs from 0.08% to 57% under strict '####' extraction, most
of it format; random rewards alone lift Qwen2.5-Math-7B by 21 points on MATH-500, Shao et al.
2025, "Spurious Rewards"). eval scores each generative item three ways (eval/runner.py): the
strict answer rule right (`correct`), lm-eval's flexible-extract right (`correct_flexible`), and
the strict rule finding any answer (`well_formed`), each a count of the item's K samples. Paired
over the items both runs scored, A − B is split into

- ``format``: the well-formed share (well_formed / K);
- ``content``: the flexible accuracy (correct_flexible / K), which ignores the answer's format;
- ``strict_given_format``: the strict accuracy among the well-formed samples (correct /
  well_formed), over the items with a well-formed sample in both runs (with K = 1: the strict
  accuracy of the items well-formed in both runs);

each with its paired SE, z and 95% interval (eval/metrics.paired_gap, as `eval compare` pairs the
headline). With K > 1 samples in both runs, the pass@k curves of both, k = 1 … K (the unbiased
estimator, eval/metrics.pass_at_k, averaged over items, with intervals), their paired difference
per k, and the first k where A − B takes the opposite sign of its sign at k = 1: RL can raise
pass@1 and lower pass@k at large k (Yue et al. 2025, "Does Reinforcement Learning Really
Incentivize Reasoning Capacity in LLMs Beyond the Base Model?").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import UsageError
from llmctl.eval.metrics import Z95, paired_gap, pass_at_k, summarize_scores

GEN_COLUMNS = ("task", "item", "samples", "correct", "correct_flexible", "well_formed")


@dataclass(frozen=True)
class Counts:
    """One generative item's counts over its K samples."""
    samples: int
    correct: int  # strict answer right
    correct_flexible: int | None  # flexible answer right (None: results written before eval counted it)
    well_formed: int | None  # the strict rule found an answer


def load_counts(results_dir: str | Path) -> dict[str, dict[int, Counts]]:
    """{task: {item: Counts}} for the generative tasks of a finished results directory (the caller
    has checked it: eval/compare.load_samples); tasks without per-item counts are left out."""
    import pyarrow.parquet as pq

    path = Path(results_dir) / "samples.parquet"
    try:
        names = pq.read_schema(path).names
        if not {"samples", "correct"} <= set(names):
            return {}
        cols = pq.read_table(path, columns=[c for c in GEN_COLUMNS if c in names]).to_pydict()
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: unreadable ({e})") from None
    out: dict[str, dict[int, Counts]] = {}
    n = len(cols["task"])
    for k in range(n):
        if cols["samples"][k] is None or cols["correct"][k] is None:  # a multiple-choice or loss row
            continue
        get = {c: cols[c][k] if c in cols else None for c in ("correct_flexible", "well_formed")}
        out.setdefault(str(cols["task"][k]), {})[int(cols["item"][k])] = Counts(
            int(cols["samples"][k]), int(cols["correct"][k]),
            None if get["correct_flexible"] is None else int(get["correct_flexible"]),
            None if get["well_formed"] is None else int(get["well_formed"]))
    return out


def paired(a: list[float], b: list[float]) -> dict:
    """{n, mean_a, mean_b, diff, se, z, ci_low, ci_high} of the paired difference A − B."""
    n = len(a)
    if n < 2:
        return {"n": n, "mean_a": math.fsum(a) / n if n else None, "mean_b": math.fsum(b) / n if n else None,
                "diff": None, "se": None, "z": None, "ci_low": None, "ci_high": None}
    diff, se, z = paired_gap(a, b)
    return {"n": n, "mean_a": math.fsum(a) / n, "mean_b": math.fsum(b) / n, "diff": diff, "se": se, "z": z,
            "ci_low": diff - Z95 * se, "ci_high": diff + Z95 * se}


def strict_gain(a: dict[int, Counts], b: dict[int, Counts]) -> dict:
    """`paired` A − B of the strict accuracy (correct / K) over the items both runs scored."""
    common = sorted(a.keys() & b.keys())
    return paired([a[i].correct / a[i].samples for i in common], [b[i].correct / b[i].samples for i in common])


def gain_split(a: dict[int, Counts], b: dict[int, Counts]) -> dict | None:
    """{format, content, strict_given_format}: each `paired` over the items both runs scored (the
    last over those with a well-formed sample in both; its n < 2 leaves diff None). None when a
    run has no format counts (results written before eval kept them)."""
    common = sorted(a.keys() & b.keys())
    if any(c.well_formed is None or c.correct_flexible is None for r in (a, b) for c in (r[i] for i in common)):
        return None
    formed = [i for i in common if a[i].well_formed and b[i].well_formed]
    return {
        "format": paired([a[i].well_formed / a[i].samples for i in common], [b[i].well_formed / b[i].samples for i in common]),
        "content": paired([a[i].correct_flexible / a[i].samples for i in common],
                          [b[i].correct_flexible / b[i].samples for i in common]),
        "strict_given_format": paired([a[i].correct / a[i].well_formed for i in formed],
                                      [b[i].correct / b[i].well_formed for i in formed]),
    }


def pass_curves(a: dict[int, Counts], b: dict[int, Counts]) -> dict | None:
    """pass@k of A and of B for k = 1 … K (K: the fewest samples any item has in either run), each
    {k, a, b, diff}: a and b summarize_scores of the per-item estimates, diff `paired`; and
    `cross_k`, the first k where A − B has the sign opposite its sign at k = 1 (None: it never
    does, or A and B tie at k = 1). None when some run has one sample per item."""
    common = sorted(a.keys() & b.keys())
    if len(common) < 2:
        return None
    k_max = min(min(a[i].samples, b[i].samples) for i in common)
    if k_max < 2:
        return None
    curve = []
    for k in range(1, k_max + 1):
        pa = [pass_at_k(a[i].samples, a[i].correct, k) for i in common]
        pb = [pass_at_k(b[i].samples, b[i].correct, k) for i in common]
        curve.append({"k": k, "a": summarize_scores(pa), "b": summarize_scores(pb), "diff": paired(pa, pb)})
    return {"K": k_max, "n": len(common), "curve": curve, "cross_k": crossing([p["diff"]["diff"] for p in curve])}


def crossing(diffs: list[float]) -> int | None:
    """The 1-based k of the first difference whose sign is opposite that of the first; None when
    there is none or the first is 0."""
    first = math.copysign(1, diffs[0]) if diffs and diffs[0] else 0
    for k, d in enumerate(diffs, start=1):
        if first and d and math.copysign(1, d) != first:
            return k
    return None
