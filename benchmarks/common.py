"""What every benchmark script here shares: paths, the input docs, datatrove's task stats, where
results go, and how the machine is named."""

from __future__ import annotations

import difflib
import glob
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_WARC = REPO.parent / "shared" / "data" / "web" / "pages-a.warc.gz"
LLMCTL = REPO / ".venv" / "bin" / "llmctl"  # the product's own venv, as a user runs it
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEAD = "# Benchmark results\n\nLatest figures of the scripts in this folder; see README.md for what they measure.\n"


def llmctl(*args, threads: int | None = None) -> None:
    """Run the product's CLI (`threads`: OMP_NUM_THREADS); SystemExit with its stderr's tail when it fails."""
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    p = subprocess.run([str(LLMCTL), *map(str, args)], env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"llmctl {' '.join(map(str, args[:3]))} … failed:\n{p.stderr[-2000:]}")


def once(out: Path, *args, threads: int | None = None) -> dict:
    """`llmctl *args -o out` unless out already holds its finished output (a rerun makes only what
    is missing); the output's manifest."""
    if not (out / "manifest.json").exists():
        llmctl(*args, "-o", out, "--overwrite", "-q", threads=threads)
    return json.loads((out / "manifest.json").read_text())


def write_results(name: str, section: str) -> None:
    """Replace (or append) the `## name` section of RESULTS.md, keeping the others as they are.
    The file is read right before it is written: each script rewrites only its own section."""
    parts = (RESULTS.read_text() if RESULTS.exists() else HEAD).split("\n## ")
    new = section.removeprefix("## ").rstrip("\n") + "\n"
    i = next((i for i, p in enumerate(parts[1:], 1) if p.split("\n", 1)[0].strip() == name), None)
    parts = parts[:i] + [new] + parts[i + 1 :] if i else parts + [new]
    RESULTS.write_text("\n## ".join(p.rstrip("\n") + "\n" for p in parts))


def cpu_name() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def pct(n: int, d: int, digits: int = 1) -> str:
    return f"{100 * n / d:.{digits}f}% ({n}/{d})" if d else "n/a"


def make_docs(tmp: str, name: str = "docs") -> str:
    """The docs crawl-extract makes from pages-a.warc.gz (once per benchmark run)."""
    out = os.path.join(tmp, name)
    cmd = [str(LLMCTL), "crawl-extract", str(DEFAULT_WARC), "-o", out, "--quiet"]
    print(f"making the input: {' '.join(cmd)}", file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def datatrove_tasks_with_docs(out: str, reader: str) -> str:
    """'used/total' tasks, from datatrove's per-task stats (`reader`: a word of the reader step's
    name): shows that one input file keeps only one task busy."""
    used = total = 0
    for path in sorted(glob.glob(os.path.join(out, "logs", "stats", "*.json"))):
        total += 1
        with open(path) as f:
            stats = json.load(f)
        step = next((s for s in stats if reader in s["name"]), None)
        used += bool(step and step["stats"].get("documents", 0))
    return f"{used}/{total}"


def read_parts(folder: str) -> list[dict]:
    """Every row of a docs artifact's part-*.parquet files, in file order."""
    import pyarrow.parquet as pq

    rows = []
    for path in sorted(glob.glob(os.path.join(folder, "part-*.parquet"))):
        rows += pq.read_table(path).to_pylist()
    return rows


def timed(cmd: list[str], env: dict, log: str) -> float:
    """Wall seconds of a whole child process (start-up included); its output goes to `log`."""
    with open(log, "w") as f:
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
        dt = time.perf_counter() - t0
    if rc != 0:
        sys.exit(f"failed ({rc}): {' '.join(cmd)}\n--- {log}:\n{Path(log).read_text()[-3000:]}")
    return dt


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> None:
    """Orphaned descendants (datatrove's forkserver, which outlives its parent for a moment and
    whose pool workers are its children, not the parent's) are handed to this process instead of
    init, so that reaping them adds their CPU time to RUSAGE_CHILDREN (Linux only)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans(wait_s: float = 30.0) -> None:
    """Wait for every orphan handed to this process (see become_subreaper) to exit."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no children left
        if pid == 0:
            time.sleep(0.05)


def timed_cpu(cmd: list[str], env: dict, log: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of a whole child process and all its descendants (workers,
    forkservers, sandboxes): user + system time from getrusage(RUSAGE_CHILDREN) before and after,
    with this process a subreaper so that no descendant escapes the count. CPU seconds are the
    steadier figure on a shared machine, where other jobs stretch the wall clock."""
    become_subreaper()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(cmd, env, log)
    reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def first_difference(a: str, b: str, width: int, before: int) -> tuple[str, str] | None:
    """The first differing region of two texts, with `before` characters of context: (a's, b's)."""
    a, b = a or "", b or ""
    for op, i1, _, j1, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op != "equal":
            return a[max(0, i1 - before) : i1 + width], b[max(0, j1 - before) : j1 + width]
    return None


def run_child(script: str, side: str, inputs: dict, steps: int, threads: int, out: Path) -> dict:
    """Run `script --child SIDE` (one side of a side-by-side benchmark, in its own process with
    `threads` threads) and return the JSON it prints on its `RESULT ` line."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, script, "--child", side, "--inputs", json.dumps(inputs), "--steps", str(steps),
           "--threads", str(threads), "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode or line is None:
        raise SystemExit(f"{side} child failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(line[len("RESULT "):])


def trl_args(out: Path, steps: int, batch: int, lr: float, seed: int, pad_token) -> dict:
    """The TRL trainer settings both side-by-side benchmarks (dpo.py, reward_model.py) give their
    TRL side, matching llmctl's: constant rate, no warmup or decay, AdamW (0.9, 0.95, 1e-8), clip 1,
    fp32 on CPU, every step logged, nothing saved."""
    return dict(output_dir=str(out), per_device_train_batch_size=batch, gradient_accumulation_steps=1,
                learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8, max_grad_norm=1.0, max_steps=steps,
                logging_steps=1, save_strategy="no", report_to=[], seed=seed, use_cpu=True, bf16=False,
                max_length=None, dataloader_num_workers=0, optim="adamw_torch", pad_token=pad_token, disable_tqdm=True)


def child_env(threads: int) -> dict:
    """The environment of an llmctl child of a benchmark: this checkout's source, `threads` OpenMP threads."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "false"}


class Server:
    """`llmctl serve CKPT --port 0` as a child process: the model name and URL from the line it prints."""

    def __init__(self, ckpt, threads: int, *args: str):
        import queue
        import threading

        self.proc = subprocess.Popen([sys.executable, "-m", "llmctl", "serve", str(ckpt), "--port", "0", *args], env=child_env(threads),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stderr], daemon=True).start()
        try:
            line = lines.get(timeout=300)
        except queue.Empty:
            line = ""
        if not line.startswith("serving "):
            self.kill()
            raise SystemExit(f"the server did not start: {line!r}")
        self.name, self.url = line.split()[1], line.split()[-1]

    def stop(self) -> int:
        """SIGTERM, as a user stops a server; its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        """SIGKILL: a server that dies mid-run."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
