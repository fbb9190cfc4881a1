"""Everything the commands show to people: the end-of-command summary, each stage's own tables,
the inspect and lineage views, eval's score tables, rl's step line and train's live status.
Summaries and logs go to stderr; the views a command exists to print (inspect, lineage,
tokenize report, plan) go to stdout (docs/design.md §3)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichBar, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.tree import Tree

from llmctl.console import err, flatten, print_json, table


def stdout() -> Console:
    return Console(highlight=False)


def plain(message: str, **kw) -> None:
    """A line for people on stderr, printed as is (paths and counts are not rich markup)."""
    err.print(message, markup=False, highlight=False, **kw)


def report(manifest, out: str, quiet: bool, as_json: bool, hide: tuple[str, ...] = (), rate_key: str = "out") -> None:
    """The end-of-command summary: a table for people (stderr) or JSON for programs.
    `hide` drops count keys another table shows (the filter's funnel)."""
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
    rows = flatten({k: v for k, v in manifest.counts.items() if k not in hide})
    if manifest.wall_seconds and manifest.counts.get(rate_key):
        rows.append(("docs/s", f"{manifest.counts[rate_key] / manifest.wall_seconds:,.1f}"))
    rows.append(("wall seconds", manifest.wall_seconds))
    rows.append(("output", out if out != "-" else "stdout (Arrow stream)"))
    err.print(table(f"llmctl {manifest.stage}", rows))


# ---------------------------------------------------------------------------------------------
# inspect / lineage (stdout)


def inspect_view(info: dict) -> None:
    out = stdout()
    head = [(k, info[k]) for k in ("path", "kind", "stage", "created", "files", "rows", "bytes") if k in info]
    out.print(table("inspect", head))
    for key in ("counts", "records", "http_status", "content_types"):
        if info.get(key):
            out.print(table(key, flatten(info[key])))
    if info.get("schema"):
        out.print(table("schema", list(info["schema"].items()), headers=("column", "type")))
    for i, row in enumerate(info.get("samples", [])):
        out.print(table(f"sample {i}", [(k, v) for k, v in row.items()]))
    errors = info.get("errors") or []
    if errors:
        out.print(table("errors", [(e.get("file", e.get("shard", "")), e.get("offset", ""), e.get("error", e.get("message", ""))) for e in errors], headers=("where", "offset", "error")))


def lineage_tree(node: dict) -> None:
    def add(tree: Tree, n: dict) -> None:
        if "stage" in n:
            label = f"[bold]{n['kind']}[/bold] {n['path']}  ← llmctl {n['stage']} ({n.get('created', '')})"
            if n.get("changed"):
                label += "  [red]changed since[/red]"
            sub = tree.add(label)
            for c in n["inputs"]:
                add(sub, c)
        else:
            flag = " [red]changed[/red]" if n.get("changed") else " [red]missing[/red]" if n.get("missing") else ""
            sha = f" sha256:{n['sha256'][:12]}" if n.get("sha256") else ""
            tree.add(f"{n.get('kind', 'file')} {n.get('path')}{sha}{flag}")

    root = Tree("lineage")
    add(root, node)
    stdout().print(root)


# ---------------------------------------------------------------------------------------------
# data stages


def funnel(m, funnel_rows: list[dict]) -> None:
    """What each filter step removed, as shares of the input."""
    c = m.counts
    rows = [("input", f"{c.get('in', 0):,}", "", f"{c.get('chars_in', 0):,}", "")]
    for r in funnel_rows:
        rows.append((r["step"], f"-{r['docs_removed']:,}", f"{r['docs_removed_pct']:.1f}%", f"-{r['chars_removed']:,}", f"{r['chars_removed_pct']:.1f}%"))
    rows.append(("kept", f"{c.get('kept', 0):,}", f"{100 * c.get('kept', 0) / max(1, c.get('in', 0)):.1f}%", f"{c.get('chars_kept', 0):,}", f"{100 * c.get('chars_kept', 0) / max(1, c.get('chars_in', 0)):.1f}%"))
    err.print(table("funnel (share of the input)", rows, headers=("step", "docs", "% docs", "chars", "% chars")))


def dedup_tables(counts: dict) -> None:
    """MinHash's S-curve and the cluster sizes, when the run has them."""
    if "s_curve" in counts:
        sc = counts["s_curve"]
        err.print(table(f"MinHash S-curve ({sc['bands']} bands x {sc['rows']} rows, threshold ~{sc['threshold']})", [(f"J = {j}", f"{p:.4f}") for j, p in sc["p_flag"].items()], headers=("similarity", "P(flagged)")))
    if counts.get("clusters"):
        err.print(table("clusters by size", list(counts["clusters"].items()), headers=("size", "clusters")))


def decontam_tasks(m, cfg, report_files: list[str]) -> None:
    rows = [
        (name, f"{t['items']:,}", f"{t['items_contaminated']:,}", f"{100 * t['share']:.2f}%" + (" (over)" if t["over_threshold"] else ""), f"{t['docs_hit']:,}", f"{t['ngrams_matched']:,}/{t['ngrams']:,}", f"{t['short_items']:,}")
        for name, t in m.counts.get("tasks", {}).items()
    ]
    title = f"contamination per task ({cfg.ngram}-gram overlap, min overlap {cfg.min_overlap}; over: share > {cfg.threshold:g})"
    err.print(table(title, rows, headers=("task", "items", "in data", "share", "docs hit", "n-grams matched", "short items")))
    if report_files:
        err.print(f"contaminated items listed in {' and '.join(report_files)}")


def tokenizer_report(r: dict) -> None:
    out = stdout()
    out.print(table("tokenizer", [(k, r[k]) for k in ("tokenizer", "vocab_size", "eos_id", "encoder", "sample_docs", "bytes_per_token", "chars_per_token", "vocab_used", "vocab_utilization") if k in r]))
    out.print(table("special tokens", sorted(r["special_tokens"].items(), key=lambda kv: kv[1]), headers=("token", "id")))
    if r.get("languages"):
        out.print(table("languages", [(k, v["docs"], v["tokens_per_char"], v["premium_vs_en"]) for k, v in r["languages"].items()], headers=("lang", "docs", "tokens/char", "premium vs en")))
    out.print(table("longest tokens", [(t["id"], repr(t["text"]), t["bytes"]) for t in r["longest_tokens"]], headers=("id", "token", "bytes")))


# ---------------------------------------------------------------------------------------------
# eval / generate / rl


def _score_cell(v: dict) -> str:
    if "value" in v:
        return f"{v['value']:.4f}"
    return f"{v['mean']:.4f} ± {v['se']:.4f}  [{v['ci_low']:.4f}, {v['ci_high']:.4f}] ({v['interval']})"


def eval_results(results: dict, wall_seconds: float) -> None:
    rows = [(name, metric, r["n"], _score_cell(v)) for name, r in results["tasks"].items() for metric, v in r["metrics"].items()]
    err.print(table(f"llmctl eval  ({wall_seconds:.1f} s)", rows, headers=("task", "metric", "n", "mean ± SE  [95% interval]")))


def eval_compare(r: dict, a: str, b: str) -> None:
    fmt = lambda x, f=".4f": "n/a" if x is None else format(x, f)
    rows = [(t["task"], t["n"], fmt(t["mean_a"]), fmt(t["mean_b"]), fmt(t["diff"], "+.4f"), fmt(t["se"]), fmt(t["z"], ".2f"),
             f"[{fmt(t['ci_low'])}, {fmt(t['ci_high'])}]", fmt(t["questions_needed"], ",")) for t in r["tasks"]]
    err.print(table(f"A = {a}  B = {b}", rows, headers=("task", "paired n", "A", "B", "A − B", "SE", "z", "95% interval", "questions to detect")))


def generations(prompts: list[str], gens: list, chat: bool) -> None:
    """One header line per sample, then its text (after the prompt, for a base model)."""
    for p, g in zip(prompts, gens):
        typer.echo(f"--- {p!r} [{g.finish}, {len(g.ids)} tokens]")
        typer.echo(g.text if chat else p + g.text)


def rl_step(rec: dict, steps: int) -> None:
    ev = rec.get("eval")
    line = (f"step {rec['step']}/{steps}  reward {rec['reward_mean']:.3f}  acc {rec['accuracy']:.3f}  "
            f"len {rec['response_length']:.0f}  zero-var {rec['zero_variance_share']:.2f}  "
            f"gen {rec['generate_s']:.1f}s train {rec['train_s']:.1f}s")
    if ev:
        line += f"  held-out {ev['mean']:.3f} [{ev['ci_low']:.3f}, {ev['ci_high']:.3f}]"
    plain(line)


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
            bpb = f"  bits/byte {s.val['bits_per_byte']:.4f}" if "bits_per_byte" in s.val else ""
            message = f"step {s.step}: val loss {s.val['loss']:.4f}{bpb}"
            (self.bar.console.print if self.bar else err.print)(message, markup=False, highlight=False)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
