"""Everything the commands show to people: the end-of-command summary, each stage's own tables,
the inspect and lineage views, eval's score tables, rl's step line and train's live status.
Summaries and logs go to stderr; the views a command exists to print (inspect, lineage,
tokenize report, plan) go to stdout (docs/design.md §3).

Every table is laid out for an 80-column terminal: short headers explained by a legend line under
the table, numbers right-aligned and never broken, long names and paths folded, a table too wide
for 80 columns split in two (tests/test_render.py renders each one at 80 columns)."""

from __future__ import annotations

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichBar, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from llmctl.artifacts.manifest import error_place
from llmctl.cli.console import err, flatten, print_json, table


def stdout() -> Console:
    return Console(highlight=False)


def plain(message: str, **kw) -> None:
    """A line for people on stderr, printed as is (paths and counts are not rich markup)."""
    err.print(message, markup=False, highlight=False, **kw)


def count(v):
    """A count with thousands separators (10,238,661 reads at a glance; 10238661 does not)."""
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else v


def legend(console: Console, *lines: str) -> None:
    """What a table's short headers and marks mean, under it; wrapped to the terminal at spaces."""
    for line in lines:
        console.print(line, markup=False, highlight=False, style="dim")


def fields(parts: list[str], width: int, indent: str = "  ") -> str:
    """Fields joined by two spaces, a line broken between fields (never inside one) where the
    next would pass `width`; continuation lines are indented."""
    lines = [parts[0]]
    for p in parts[1:]:
        if len(lines[-1]) + 2 + len(p) <= width:
            lines[-1] += "  " + p
        else:
            lines.append(indent + p)
    return "\n".join(lines)


def report(manifest, out: str, quiet: bool, as_json: bool, hide: tuple[str, ...] = (), rate_key: str = "out",
           stream: str = "Arrow stream") -> None:
    """The end-of-command summary: a table for people (stderr) or JSON for programs.
    `hide` drops count keys another table shows (the filter's funnel); `stream`: what `-o -` wrote."""
    summary = {
        "stage": manifest.stage,
        "output": out,
        "counts": manifest.counts,
        "files": len(manifest.outputs),
        "wall_seconds": manifest.wall_seconds,
        "errors": manifest.errors[:20],
    }
    if as_json:
        print_json(summary, to_stderr=out == "-")
        return
    if quiet:
        return
    rows = [(k, count(v)) for k, v in flatten({k: v for k, v in manifest.counts.items() if k not in hide})]
    if manifest.wall_seconds and manifest.counts.get(rate_key):
        unit = "docs" if rate_key in ("in", "out", "docs") else rate_key  # train's rate is tokens/s, rl's steps/s
        rows.append((f"{unit}/s", f"{manifest.counts[rate_key] / manifest.wall_seconds:,.1f}"))
    rows.append(("wall seconds", manifest.wall_seconds))
    rows.append(("output", out if out != "-" else f"stdout ({stream})"))
    err.print(table(f"llmctl {manifest.stage}", rows))


# ---------------------------------------------------------------------------------------------
# inspect / lineage (stdout)


def inspect_view(info: dict) -> None:
    out = stdout()
    head = [(k, count(info[k])) for k in ("path", "kind", "stage", "created", "files", "rows", "bytes") if k in info]
    out.print(table("inspect", head))
    for key in ("counts", "records", "http_status", "content_types"):
        if info.get(key):
            out.print(table(key, [(k, count(v)) for k, v in flatten(info[key])]))
    if info.get("schema"):
        out.print(table("schema", list(info["schema"].items()), headers=("column", "type")))
    for i, row in enumerate(info.get("samples", [])):
        out.print(table(f"sample {i}", [(k, v) for k, v in row.items()]))
    errors = info.get("errors") or []
    if errors:
        out.print(table("errors", [(error_place(e), e.get("error", e.get("message", ""))) for e in errors], headers=("where", "error")))


def document_view(doc: dict) -> None:
    out = stdout()
    out.print(table(f"document {doc['id']}", [(k, v) for k, v in doc["row"].items() if k != "removed_spans"]))
    spans = doc["removed_spans"]
    if spans:
        rows = [(f"{s['start']:,}-{s['end']:,}", f"{s['bytes']:,}", s["text"] if s["text"] is not None else "(cut; --keep-rejected keeps the text)") for s in spans]
        out.print(table("removed spans (UTF-8 bytes of the text as read)", rows, headers=("bytes", "length", "text"), numeric=(1,)))


def lineage_tree(node: dict) -> None:
    """The tree of manifests; a node whose line would not fit at its depth puts its path on a
    line of its own, where a long path folds without taking the stage and date with it."""
    console = stdout()

    def label(head: str, path: str, tail: str, depth: int) -> str:
        one = f"{head} {path}{tail}"
        if cell_len(Text.from_markup(one).plain) <= console.width - 4 * depth:
            return one
        return f"{head}{tail}\n{path}"

    def add(tree: Tree, n: dict, depth: int) -> None:
        path = escape(str(n.get("path")))
        if "stage" in n:
            changed = "  [red]changed since[/red]" if n.get("changed") else ""
            sub = tree.add(label(f"[bold]{n['kind']}[/bold]", path, f"  ← llmctl {n['stage']} ({n.get('created', '')}){changed}", depth))
            for c in n["inputs"]:
                add(sub, c, depth + 1)
        else:
            flag = " [red]changed[/red]" if n.get("changed") else " [red]missing[/red]" if n.get("missing") else ""
            sha = f" sha256:{n['sha256'][:12]}" if n.get("sha256") else ""
            if n.get("path") == "-":  # a stream read on stdin: no path to follow, what was read instead
                what = ", ".join(x for x in (n.get("format"), f"{n['bytes']:,} bytes" if n.get("bytes") is not None else None) if x)
                path = f"stdin ({what})" if what else "stdin"
            tree.add(label(escape(n.get("kind", "file")), path, f"{sha}{flag}", depth))

    root = Tree("lineage")
    add(root, node, 1)
    console.print(root)


# ---------------------------------------------------------------------------------------------
# data stages


def funnel(m, funnel_rows: list[dict]) -> None:
    """What each filter step removed, as shares of the input."""
    c = m.counts
    rows = [("input", f"{c.get('in', 0):,}", "", f"{c.get('chars_in', 0):,}", "")]
    for r in funnel_rows:
        rows.append((r["step"], f"-{r['docs_removed']:,}", f"{r['docs_removed_pct']:.1f}%", f"-{r['chars_removed']:,}", f"{r['chars_removed_pct']:.1f}%"))
    rows.append(("kept", f"{c.get('kept', 0):,}", f"{100 * c.get('kept', 0) / max(1, c.get('in', 0)):.1f}%", f"{c.get('chars_kept', 0):,}", f"{100 * c.get('chars_kept', 0) / max(1, c.get('chars_in', 0)):.1f}%"))
    err.print(table("funnel (share of the input)", rows, headers=("step", "docs", "% docs", "chars", "% chars"), numeric=(1, 2, 3, 4)))


def dedup_tables(counts: dict) -> None:
    """MinHash's S-curve and the cluster sizes, when the run has them."""
    if "s_curve" in counts:
        sc = counts["s_curve"]
        err.print(table("MinHash S-curve", [(f"J = {j}", f"{p:.4f}") for j, p in sc["p_flag"].items()], headers=("similarity", "P(flagged)"), numeric=(1,)))
        legend(err, f"{sc['bands']} bands x {sc['rows']} rows: P(flagged | J) = 1 - (1 - J^{sc['rows']})^{sc['bands']}, threshold ~{sc['threshold']}")
    if counts.get("clusters"):
        err.print(table("clusters by size", [(k, f"{v:,}") for k, v in counts["clusters"].items()], headers=("size", "clusters"), numeric=(1,)))
    if counts.get("semantic"):
        sem = counts["semantic"]
        err.print(table("k-means clusters by size", [(k, f"{v:,}") for k, v in sem["kmeans_clusters"].items()], headers=("documents", "clusters"), numeric=(1,)))
        legend(err, f"SemDeDup: pairs inside a cluster with cosine similarity above {1 - sem['eps']:g} are duplicates")
    spans = counts.get("spans")
    if spans:
        from llmctl.data.dedup.spans import length_buckets, top_spans

        methods = [(m, f"{v['docs_cut']:,}", f"{v['spans']:,}", f"{v['bytes']:,}", f"{100 * v['bytes'] / max(1, spans['bytes_in']):.2f}%")
                   for m, v in spans.items() if m in ("substring", "sentences")]
        err.print(table("spans cut", methods, headers=("method", "docs cut", "spans", "bytes", "of bytes in"), numeric=(1, 2, 3, 4)))
        err.print(table("cut spans by length", [(k, f"{v:,}") for k, v in length_buckets(spans)], headers=("bytes", "spans"), numeric=(1,)))
        if spans.get("top"):
            err.print(table("most repeated cut spans", [(f"{n:,}", t[:70]) for t, n in top_spans(spans, 5)], headers=("copies cut", "span (start)"), numeric=(0,)))
        legend(err, f"documents dropped as too short after the cut: {spans['docs_dropped_short']:,}")


def decontam_tasks(m, cfg, report_files: list[str]) -> None:
    rows = [
        (name, f"{t['items']:,}", f"{t['items_contaminated']:,}", f"{100 * t['share']:.2f}%" + ("*" if t["over_threshold"] else " "),
         f"{t['docs_hit']:,}", f"{t['ngrams_matched']:,}/{t['ngrams']:,}", f"{t['short_items']:,}")
        for name, t in m.counts.get("tasks", {}).items()
    ]
    err.print(table(f"contamination per task ({cfg.ngram}-gram overlap)", rows,
                    headers=("task", "items", "found", "share", "docs", "n-grams", "short"), numeric=(1, 2, 3, 4, 5, 6)))
    shared = f"a {cfg.ngram}-gram" if cfg.min_overlap == 1 else f"{cfg.min_overlap} distinct {cfg.ngram}-grams"
    legend(err, f"found: items sharing {shared} with a training doc; "
                f"share: found / items, * over {cfg.threshold:g}; docs: training docs hit; "
                f"n-grams: the task's n-grams found / all; short: items under {cfg.ngram} words, matched whole")
    if report_files:
        plain(f"contaminated items listed in {' and '.join(report_files)}")


def tokenizer_report(r: dict) -> None:
    out = stdout()
    out.print(table("tokenizer", [(k, r[k]) for k in ("tokenizer", "vocab_size", "eos_id", "encoder", "sample_docs", "bytes_per_token", "chars_per_token", "vocab_used", "vocab_utilization") if k in r]))
    out.print(table("special tokens", sorted(r["special_tokens"].items(), key=lambda kv: kv[1]), headers=("token", "id"), numeric=(1,)))
    if r.get("languages"):
        out.print(table("languages", [(k, f"{v['docs']:,}", v["tokens_per_char"], v["premium_vs_en"]) for k, v in r["languages"].items()],
                        headers=("lang", "docs", "tokens/char", "premium vs en"), numeric=(1, 2, 3)))
    out.print(table("longest tokens", [(t["id"], repr(t["text"]), t["bytes"]) for t in r["longest_tokens"]], headers=("id", "token", "bytes"), numeric=(0, 2)))


def hardware_list(rows: list[tuple], headers: tuple) -> None:
    """`plan --list-gpus`: the peaks in one table, names and sources in a second, so that each
    fits 80 columns (rows and headers: cli/plan_tables.py hardware_rows, HARDWARE_HEADERS)."""
    out = stdout()
    peaks = [(r[0], *r[2:8]) for r in rows]
    units = tuple(h.replace(" ", "\n", 1) for h in headers[2:8])  # "BF16 TFLOP/s": the unit under the name
    out.print(table("accelerators (dense peaks)", peaks, headers=(headers[0], *units), numeric=(1, 2, 3, 4, 5, 6)))
    out.print(table("accelerators: names and sources", [(r[0], r[1], r[8]) for r in rows], headers=(headers[0], headers[1], headers[8])))


# ---------------------------------------------------------------------------------------------
# eval / generate / rl


def _num(x, f: str = ".4f") -> str:
    return "n/a" if x is None else format(x, f)


# what each multiple-choice accuracy takes the argmax of, in the table's legend
MC_METRICS = {"acc": "argmax of ln P(choice | context), lm-eval's acc", "acc_norm": "of ln P / characters, lm-eval's acc_norm",
              "acc_per_token": "of ln P / tokens", "acc_pmi": "of ln P - ln P(choice | 'Answer:')"}


# what each generative score reads (eval/runner.py, tasks/answers.GenScoring)
GEN_METRICS = {"acc": "the task's answer rule ('#### n', \\boxed{}), strict", "acc_flexible": "the last number (lm-eval's flexible-extract)",
               "well_formed": "the strict rule finds an answer"}


def eval_results(results: dict, wall_seconds: float) -> None:
    """Each task's scores, its headline starred: a task's name with its n, then one row per metric
    (mean, SE, interval), so the table fits 80 columns; results.json has every digit."""
    t = Table(title=f"llmctl eval  ({wall_seconds:.1f} s)", title_justify="left")
    t.add_column("task", overflow="fold")
    t.add_column("metric", no_wrap=True)
    for h in ("mean", "SE", "95% interval"):
        t.add_column(h, justify="right", no_wrap=True)
    tasks = results["tasks"]
    for i, (name, r) in enumerate(tasks.items()):
        for j, (metric, v) in enumerate(r["metrics"].items()):
            label = name if j == 0 else f"n = {r['n']:,}" if j == 1 else ""
            star = " *" if metric == r.get("headline") else ""
            if "value" in v:  # loss and perplexity: pooled over every token, no interval
                t.add_row(label, metric + star, _num(v["value"]), "", "")
            else:
                t.add_row(label, metric + star, _num(v["mean"]), _num(v["se"]), f"[{_num(v['ci_low'])}, {_num(v['ci_high'])}]")
        if len(r["metrics"]) == 1:
            t.add_row(f"n = {r['n']:,}", "", "", "", "")
        if i < len(tasks) - 1:
            t.add_section()
    err.print(t)
    notes = []
    if any(r.get("headline") for r in tasks.values()):  # results written before tasks named theirs have no star
        notes.append("* the task's headline score (results.json \"headline\"; multiple choice: --norm).")
    shown = {m for r in tasks.values() for m in r["metrics"]}
    if shown & set(MC_METRICS) - {"acc"}:  # a multiple-choice task: say which normalization each name is
        notes.append("multiple choice: " + "; ".join(f"{m}: {MC_METRICS[m]}" for m in MC_METRICS if m in shown) + ".")
    if shown & {"acc_flexible", "well_formed"}:  # a generative task: say which reading each name is
        notes.append("generative: " + "; ".join(f"{m}: {GEN_METRICS[m]}" for m in GEN_METRICS if m in shown) + ".")
    notes.append("95% interval: Wilson's for 0/1 scores when n < 100 or either outcome is under 10, else Wald's.")
    legend(err, *notes)


def eval_compare(r: dict, a: str, b: str) -> None:
    """The paired comparison in two tables that each fit 80 columns: the scores and their
    difference, then whether the difference is real."""
    plain(f"A = {a}")
    plain(f"B = {b}")
    rows = [(t["task"], t.get("metric") or "score", f"{t['n']:,}", _num(t["mean_a"]), _num(t["mean_b"]), _num(t["diff"], "+.4f"))
            for t in r["tasks"]]
    err.print(table("scores", rows, headers=("task", "metric", "n", "A", "B", "A − B"), numeric=(2, 3, 4, 5)))
    rows = [(t["task"], _num(t["se"]), _num(t["z"], ".2f"), f"[{_num(t['ci_low'], '+.4f')}, {_num(t['ci_high'], '+.4f')}]",
             _num(t["questions_needed"], ",")) for t in r["tasks"]]
    err.print(table("is A − B real?", rows, headers=("task", "SE", "z", "95% interval", "questions\nto detect"), numeric=(1, 2, 3, 4)))
    notes = ["n: items scored in both runs. questions to detect: paired items needed to detect a gap this "
             "size (two-sided α 0.05, power 0.8); n/a: no gap."]
    notes += [f"{t['task']}: {t['only_a']:,} item(s) only in A, {t['only_b']:,} only in B, not compared."
              for t in r["tasks"] if t.get("only_a") or t.get("only_b")]
    legend(err, *notes)
    for t in r["tasks"]:
        if t.get("split"):
            _gain_split(t["task"], t["split"])
        if t.get("pass_at_k"):
            _pass_curves(t["task"], t["pass_at_k"])


SPLIT_LABELS = {"format": "format", "content": "flexible", "strict_given_format": "strict | wf"}


def _gain_split(task: str, split: dict) -> None:
    """A generative task's A − B split into format and content (eval/split.py), one row each."""
    rows = [(SPLIT_LABELS[part], f"{p['n']:,}", _num(p["mean_a"]), _num(p["mean_b"]), _num(p["diff"], "+.4f"),
             "" if p["diff"] is None else f"[{_num(p['ci_low'], '+.4f')}, {_num(p['ci_high'], '+.4f')}]", _num(p["z"], ".2f"))
            for part, p in split.items()]
    err.print(table(f"what A − B is made of: {task}", rows, headers=("", "n", "A", "B", "A − B", "95% interval", "z"),
                    numeric=(1, 2, 3, 4, 5, 6)))
    legend(err, "format: share of answers well-formed (the strict rule finds one). flexible: accuracy of the last "
                "number (lm-eval's flexible-extract), whatever the format. strict | wf: strict accuracy among "
                "well-formed answers, on the items well-formed in both runs.")


def _pass_curves(task: str, curves: dict) -> None:
    """pass@k of A and B at the powers of 2 below K, at K and at the k where A − B changes sign (--json: every k)."""
    K, cross = curves["K"], curves["cross_k"]
    shown = sorted({k for k in (2 ** j for j in range(K.bit_length())) if k <= K} | {K} | ({cross} if cross else set()))

    def cell(s: dict) -> str:
        return f"{s['mean']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]"

    rows = [(f"{p['k']}" + (" ×" if p["k"] == cross else ""), cell(p["a"]), cell(p["b"]), _num(p["diff"]["diff"], "+.3f"),
             _num(p["diff"]["z"], ".2f")) for p in curves["curve"] if p["k"] in shown]
    err.print(table(f"pass@k: {task}  ({curves['n']:,} items)", rows, headers=("k", "A [95%]", "B [95%]", "A − B", "z"),
                    numeric=(0, 1, 2, 3, 4)))
    where = f"A − B changes sign at k = {cross} (×)" if cross else "A − B keeps its sign at every k"
    legend(err, f"unbiased pass@k, mean over items, intervals across items; {where}; shown: k = "
                f"{', '.join(map(str, shown))} (--json: every k up to {K}).")


def generations(prompts: list[str], gens: list, chat: bool) -> None:
    """One header line per sample, then its text (after the prompt, for a base model)."""
    for p, g in zip(prompts, gens):
        typer.echo(f"--- {p!r} [{g.finish}, {len(g.ids)} tokens]")
        typer.echo(g.text if chat else p + g.text)


def rl_step(rec: dict, steps: int) -> None:
    """One step's line, broken between fields where the terminal is too narrow for it."""
    ev = rec.get("eval")
    parts = [f"step {rec['step']}/{steps}", f"reward {rec['reward_mean']:.3f}", f"acc {rec['accuracy']:.3f}",
             f"len {rec['response_length']:.0f}", f"zero-var {rec['zero_variance_share']:.2f}",
             f"gen {rec['generate_s']:.1f}s", f"train {rec['train_s']:.1f}s"]
    if "control" in rec:  # a control run: the reward it trained on, named by the control, then the real one of the same samples
        parts[1:2] = [f"{rec['control']} {rec['reward_mean']:.3f}", f"real {rec['real_reward_mean']:.3f}"]
    if ev:
        parts.append(f"held-out {ev['mean']:.3f} [{ev['ci_low']:.3f}, {ev['ci_high']:.3f}]")
    plain(fields(parts, err.width))


# ---------------------------------------------------------------------------------------------
# train


class TrainStatus:
    """The live status line of `llmctl train`: a bar over steps with loss, lr, tokens/s and MFU.
    Without a terminal (logs, CI) it prints a line at every validation pass and every 10% instead."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.bar: RichBar | None = None
        self.task = None
        self.last_printed = 0

    def log(self, message: str) -> None:
        if not self.quiet:
            plain(message, soft_wrap=True)

    def _line(self, s) -> str:
        mfu = f"  mfu {100 * s.mfu:.1f}%" if s.mfu is not None else ""
        return f"loss {s.loss:.4f}  lr {s.lr:.2e}  {s.tokens_per_s:,.0f} tok/s{mfu}"

    def step(self, s) -> None:
        if self.quiet:
            return
        if err.is_terminal:
            if self.bar is None:
                self.bar = RichBar(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[line]}"),
                                   TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True)
                self.bar.start()
                self.task = self.bar.add_task("train", total=s.total_steps, completed=s.step - 1, line="")
            self.bar.update(self.task, completed=s.step, line=self._line(s))
        elif s.val is None and s.step - self.last_printed < max(1, s.total_steps // 10):
            return
        else:
            self.last_printed = s.step
            plain(f"step {s.step}/{s.total_steps}  {self._line(s)}")
        if s.val is not None:
            parts = [f"val loss {s.val['loss']:.4f}" + (f"  bits/byte {s.val['bits_per_byte']:.4f}" if "bits_per_byte" in s.val else "")] \
                if "loss" in s.val else []
            parts += [f"{name} {v['loss']:.4f}" + (f" ({v['bits_per_byte']:.4f} bits/byte)" if "bits_per_byte" in v else "")
                      for name, v in s.val.get("sources", {}).items()]  # a mixture's sources, each on its own held-out set
            message = f"step {s.step}: " + "; ".join(parts)
            if getattr(s, "val_ema", None):  # --ema-decay: the averaged weights on the same windows
                message += f"  (EMA weights: loss {s.val_ema['loss']:.4f})"
            (self.bar.console.print if self.bar else err.print)(message, markup=False, highlight=False)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
