"""rl, what the gain is made of: the evals of an rl run set against the evals of the model it started
from (its SFT model), on the same generative task with the same samples and temperature, and the
control runs beside it (`llmctl rl --control`, report/collect.py finds them).

- scores: each eval's strict accuracy (the headline), flexible accuracy and well-formed share, with
  their intervals (results.json);
- the gain split (eval/split.gain_split, as `llmctl eval compare` gives it): strict, format
  (well-formed share), content (flexible accuracy) and strict accuracy among items well-formed in
  both, each paired with its interval and z — for the real run and for each control;
- pass@k of both models for k = 1 … K when both were evaluated with `-n K`, its figure, and the k
  where RL − start changes sign (Yue et al. 2025);
- one sentence, computed from those numbers, that says what the gain is made of and what the
  controls gained.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import UsageError
from llmctl.eval.split import Counts, gain_split, load_counts, pass_curves, strict_gain
from llmctl.report import charts
from llmctl.report.collect import Artifact, Lineage, is_control, model_of
from llmctl.report.page import Figure, Section, Table
from llmctl.report.sections.common import Images, read_json

PARTS = (("strict", "strict (headline)"), ("format", "format: well-formed share"),
         ("content", "content: flexible accuracy"), ("strict_given_format", "strict among well-formed in both"))
CONTROL_REWARDS = {"random-reward": "a reward that ignores the completions",
                   "shuffled-answers": "a reward for other prompts' answers"}
SCORES = (("acc", "strict"), ("acc_flexible", "flexible"), ("well_formed", "well-formed"))


@dataclass
class Scored:
    """One generative task of one eval, with what it pairs on."""
    eval: Artifact
    task: str
    samples: int  # K per item
    temperature: float
    metrics: dict  # results.json's metrics of the task
    counts: dict[int, Counts]

    @property
    def key(self) -> tuple:
        return self.task, self.samples, self.temperature

    @property
    def label(self) -> str:
        return f"{self.eval.path.name} ({'greedy' if self.samples == 1 and not self.temperature else f'K={self.samples}, T={self.temperature:g}'})"


def scored(evals: list[Artifact]) -> list[Scored]:
    """The generative tasks with per-item counts of these evals (results written before the counts,
    or unreadable ones, give none)."""
    out = []
    for ev in evals:
        results = read_json(ev.path / "results.json")
        cfg = results.get("config") or {}
        try:
            counts = load_counts(ev.path)
        except UsageError:
            continue
        for task, items in counts.items():
            if items:
                k = min(c.samples for c in items.values())
                metrics = ((results.get("tasks") or {}).get(task) or {}).get("metrics") or {}
                out.append(Scored(ev, task, k, float(cfg.get("temperature") or 0.0), metrics, items))
    return out


def pairs(mine: list[Scored], start: list[Scored]) -> list[tuple[Scored, Scored]]:
    """Each of this run's scored tasks with the start model's on the same (task, K, temperature): the
    one in the same folder when there is one, else the latest."""
    out = []
    for m in mine:
        same = [s for s in start if s.key == m.key]
        if same:
            out.append((m, max(same, key=lambda s: (s.eval.path.parent == m.eval.path.parent, s.eval.manifest.created))))
    return out


def primary(run_pairs: list[tuple[Scored, Scored]], key: tuple | None = None) -> tuple[Scored, Scored] | None:
    """The pair that speaks for a run: the one on `key` (the real run's), else a greedy one, else the first."""
    return (next((p for p in run_pairs if p[0].key == key), None)
            or next((p for p in run_pairs if p[0].samples == 1 and not p[0].temperature), None)
            or (run_pairs[0] if run_pairs else None))


def strict_split(a: Scored, b: Scored) -> dict:
    """gain_split plus the strict (headline) accuracy's own paired gain, over the items both scored."""
    return {"strict": strict_gain(a.counts, b.counts), **(gain_split(a.counts, b.counts) or {})}


def add(a: Artifact, s: Section, lineage: Lineage, images: Images) -> None:
    """The tables, figure and sentence of rl run `a`'s gain, into its section."""
    start = model_of(a)
    if is_control(a) or start is None:
        return
    of = lambda run: [e for e in lineage.evals + lineage.control_evals if (m := model_of(e)) is not None and m.resolve() == run.resolve()]  # noqa: E731
    start_scored = scored(of(start))
    own = pairs(scored(of(a.path)), start_scored)
    if not own:
        s.notes.append(f"No eval of {a.path.name} and of {start.name} on the same generative task with the same samples: "
                       "`llmctl eval` both (e.g. `-t gsm8k:FILE`) beside the run to see what its gain is made of.")
        return
    shown = list({id(x): x for pair in own for x in (pair[1], pair[0])}.values())
    s.tables.append(Table(["eval", "model", "task", "K", *(c for _, name in SCORES for c in (name, "95% low", "95% high"))],
                          [[x.eval.path.name, a.path.name if any(x is p[0] for p in own) else start.name, x.task, x.samples,
                            *(v for key, _ in SCORES for v in _score(x.metrics.get(key)))] for x in shown],
                          f"strict (the task's answer rule), flexible (the last number: lm-eval's flexible-extract) and well-formed scores of {a.path.name} and of {start.name}, the model it started from"))
    controls = [c for c in lineage.controls if (m := model_of(c)) is not None and m.resolve() == start.resolve()]
    runs = [(a, own)] + [(c, pairs(scored(of(c.path)), start_scored)) for c in controls]
    lead = primary(own)
    rows, splits = [], {}  # splits: run path -> (its eval, the start's, the split) of the pair that speaks for it
    for run, run_pairs in runs:
        speaker = primary(run_pairs, lead[0].key)
        for m, b in run_pairs:
            split = strict_split(m, b)
            if speaker is not None and m is speaker[0] and b is speaker[1]:
                splits[run.path] = (m, b, split)
            for key, name in PARTS:
                p = split.get(key)
                if p is not None:
                    rows.append([run.path.name, f"{m.label} − {b.label}", name, p["n"], p["mean_b"], p["mean_a"], p["diff"], p["ci_low"], p["ci_high"], p["z"]])
    s.tables.append(Table(["run", "compared", "part", "n", "start", "run's", "gain", "95% low", "95% high", "z"], rows,
                          f"what the gain is made of: each run against {start.name} on the items both scored, paired "
                          "(format: the share of answers the strict rule can read; content: flexible accuracy, any ending; "
                          "strict among well-formed: accuracy where both runs wrote a readable answer)"))
    if controls:
        s.tables.append(Table(["run", "control", "seed", "own held-out accuracy (last step)", "strict gain", "95% low", "95% high",
                               "real run's gain over it", "95% low", "95% high", "last-step reward", "last-step real reward"],
                              [_run_row(run, splits.get(run.path), splits[a.path]) for run, _ in runs],
                              f"the real run and its controls: the same start, steps and compute; strict gain over {start.name} "
                              "(paired), and the real run's strict gain over each control (paired on the same items)"))
    _pass_at_k(a, s, own, start, images)
    s.notes.append(sentence(a.path.name, start.name, splits.get(a.path),
                            [(c, (*splits[c.path], lead_over(splits[a.path], splits[c.path])) if c.path in splits else None)
                             for c in controls]))


def _score(v: dict | None) -> list:
    return [None, None, None] if not v else [v.get("mean"), v.get("ci_low"), v.get("ci_high")]


def lead_over(real: tuple | None, control: tuple | None) -> dict:
    """The real run's strict gain over a control, paired on the items both scored ({} when their
    evals are not of one task)."""
    if real is None or control is None or real[0].task != control[0].task:
        return {}
    return strict_gain(real[0].counts, control[0].counts)


def _run_row(run: Artifact, mine: tuple | None, real: tuple) -> list:
    """A row of the controls table: the run, its gain over the start, the real run's lead over it."""
    c, cfg, last = run.manifest.counts, run.manifest.config, _last_step(run.path)
    over = lead_over(real, mine) if mine is not None and mine[0] is not real[0] else {}
    strict = mine[2]["strict"] if mine else {}
    return [run.path.name, cfg.get("control", "none"), cfg.get("seed"), c.get("eval_accuracy"), strict.get("diff"), strict.get("ci_low"),
            strict.get("ci_high"), over.get("diff"), over.get("ci_low"), over.get("ci_high"),
            last.get("reward_mean"), last.get("real_reward_mean", last.get("reward_mean"))]


def _last_step(run: Path) -> dict:
    from llmctl.train.plots import read_metrics

    steps, _ = read_metrics(run) if (run / "metrics.jsonl").is_file() else ([], [])
    trained = [r for r in steps if "reward_mean" in r]
    return trained[-1] if trained else {}


def _pass_at_k(a: Artifact, s: Section, own: list[tuple[Scored, Scored]], start: Path, images: Images) -> None:
    for m, b in own:
        curves = pass_curves(m.counts, b.counts)
        if curves is None:
            continue
        rows = [[p["k"], p["b"]["mean"], p["a"]["mean"], p["diff"]["diff"], p["diff"]["ci_low"], p["diff"]["ci_high"]] for p in curves["curve"]]
        s.tables.append(Table(["k", start.name, a.path.name, "gain", "95% low", "95% high"], rows,
                              f"pass@k, k = 1 … {curves['K']} (unbiased estimator, {curves['n']} problems): {m.label} and {b.label}"))
        path = images.folder(s.key) / f"pass_at_k_{m.eval.path.name}.png"
        series = {name: ([p["k"] for p in curves["curve"]], [p[side]["mean"] for p in curves["curve"]],
                         [p[side]["ci_low"] for p in curves["curve"]], [p[side]["ci_high"] for p in curves["curve"]])
                  for name, side in ((start.name, "b"), (a.path.name, "a"))}
        charts.curves(path, series, f"pass@k on {m.task}", "k (samples a problem)", "pass@k")
        s.figures.append(Figure(images.rel(path), f"pass@k of {start.name} and {a.path.name}, 95% intervals"))
        cross, gains = curves["cross_k"], [p["diff"] for p in curves["curve"]]
        faded = next((p["k"] for p in curves["curve"] if sign(p["diff"]) == 0), None)
        s.notes.append(f"pass@k ({m.eval.path.name} against {b.eval.path.name}): the gain is {pts(gains[0])} at k = 1 and "
                       f"{pts(gains[-1])} at k = {curves['K']}; " + (
                           f"it changes sign at k = {cross}: past it the start model solves more problems in k tries." if cross
                           else f"its interval first reaches 0 at k = {faded}." if faded
                           else "its sign holds at every k."))


def pts(p: dict | None) -> str:
    if not p or p.get("diff") is None:
        return "— (too few items)"
    return f"{100 * p['diff']:+.1f} points [{100 * p['ci_low']:+.1f}, {100 * p['ci_high']:+.1f}]"


def sign(p: dict | None) -> int:
    """+1 / -1 when the 95% interval lies above / below 0, else 0."""
    if not p or p.get("diff") is None:
        return 0
    return 1 if p["ci_low"] > 0 else -1 if p["ci_high"] < 0 else 0


def sentence(name: str, start: str, split: tuple | None, controls: list[tuple[Artifact, tuple | None]]) -> str:
    """What the gain is made of, in words chosen by the intervals' signs (each part's 95% interval:
    above 0, below 0 or across it)."""
    if split is None:
        return f"What the gain is made of: no eval of {name} pairs with one of {start}."
    m, b, p = split
    st, fm, ct, sg = (p.get(k) for k, _ in PARTS)
    text = (f"What the gain is made of: {name}'s strict accuracy moved {pts(st)} over {start} ({m.task}, {m.label}); "
            f"the share of answers the strict rule can read moved {pts(fm)}, flexible accuracy (any ending) {pts(ct)}, "
            f"and strict accuracy among the {sg['n'] if sg else 0} items well-formed in both {pts(sg)}")
    if fm is None:
        verdict = "the evals carry no format counts (written before eval kept them), so the gain cannot be split"
    elif sign(st) == 0:
        verdict = "no gain its interval can tell from zero"
    elif sign(st) > 0 and sign(fm) > 0 and sign(sg) <= 0:
        verdict = ("the gain is format: more answers in the form the rule reads, and where both models wrote one, "
                   "the trained one is right " + ("less often" if sign(sg) < 0 else "no more often"))
    elif sign(st) > 0 and sign(fm) > 0:
        verdict = "the gain is format and content: more readable answers, and readable answers right more often"
    elif sign(st) > 0 and sign(sg) > 0:
        verdict = "the gain is content: no more readable answers, but readable answers right more often"
    elif sign(st) > 0:
        verdict = "a gain that neither the format nor the well-formed items alone tell apart"
    else:
        verdict = "a loss: " + ("fewer readable answers" if sign(fm) < 0 else "readable answers right less often" if sign(sg) < 0 else "spread over format and content")
    text += f" — {verdict}."
    for c, cs in controls:
        kind = c.manifest.config.get("control")
        if cs is None:
            text += f" The {kind} control {c.path.name} has no eval paired with {start}'s."
            continue
        cst, over = cs[2]["strict"], cs[3]
        what = CONTROL_REWARDS.get(kind, "its reward")
        bonus = c.manifest.config.get("format_reward") or 0
        if kind == "shuffled-answers" and bonus:
            what += f" (and the format bonus, {bonus:g}, for any readable answer)"
        text += f" The {kind} control moved strict accuracy {pts(cst)}, the real run's lead over it is {pts(over)}: " + (
            f"{what} costs accuracy here." if sign(cst) < 0 and sign(over) > 0
            else f"{what} gives no gain here." if sign(cst) == 0 and sign(over) > 0
            else f"it gains as much as the real run — {what} teaches what the real reward does, so the gain does not need right answers." if sign(cst) > 0 and sign(over) == 0
            else f"{what} gives part of the gain; the real run's lead over it needs the right answers." if sign(cst) > 0 and sign(over) > 0
            else "the control does better than the real run." if sign(over) < 0
            else "neither its gain nor the real run's lead over it can be told from zero.")
    return text
