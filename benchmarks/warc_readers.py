"""WARC reading for crawl-extract: warcio against fastwarc, inside llmctl's range-split reader (issue 22).

    .venv-bench/bin/python benchmarks/warc_readers.py [--warc PATH] [--repeat N]

llmctl's reader (src/llmctl/data/crawl/warc.py) finds and inflates each gzip member itself, so it knows
every record's byte offset and can step over a damaged member; only the parsing of a member's
records is a library's. Timed here, CPU ms per HTML 200 response of the WARC (median of --repeat):
  - gunzip: the members inflated by llmctl's reader (zlib), as crawl-extract does;
  - records, warcio: those members parsed with warcio as crawl-extract does (WARC and HTTP headers,
    status, Content-Type, the body with chunking and Content-Encoding undone);
  - records, fastwarc: the same members parsed by fastwarc's ArchiveIterator (auto_decode="all");
  - fastwarc alone: fastwarc reading the whole file with its own gzip reader (no byte ranges).
Then every file of ../shared/data/warc-bad/ read both ways (llmctl's reader with warcio, and
fastwarc alone): records found and damage reported, so "gives the same records" is checked, not
assumed. The tables go to stdout and into benchmarks/RESULTS.md (## crawl-extract: WARC readers).
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import statistics
import sys
import time

from common import DEFAULT_WARC, REPO, cpu_name, write_results  # noqa: E402  (benchmarks/common.py)

BAD = REPO.parent / "shared" / "data" / "warc-bad"


def members(path: str) -> list[bytes]:
    """The gzip members' contents, read the way crawl-extract reads them."""
    from llmctl.data.crawl import warc

    out = []
    with open(path, "rb") as f:
        size = warc._size(f)
        pos, rest = 0, b""
        while pos < size:
            content, pos, rest = warc._read_member(f, pos, rest)
            out.append(content)
    return out


def parse_warcio(contents: list[bytes]) -> int:
    from llmctl.data.crawl.extract import http_headers
    from llmctl.data.crawl.warc import records_in

    pages = 0
    for content in contents:
        for item in records_in(content, 0):
            rec = item.record
            if rec.rec_type != "response":
                continue
            rec.rec_headers.get_header("WARC-Record-ID")
            http = http_headers(rec, rec.rec_headers.get_header("WARC-Target-URI") or "")
            if http is not None and http.get_statuscode() == "200":
                http.get_header("Content-Type")
                rec.content_stream().read()
                pages += 1
    return pages


def parse_fastwarc(stream) -> int:
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    pages = 0
    for rec in ArchiveIterator(stream, parse_http=True, auto_decode="all"):
        if rec.record_type != WarcRecordType.response:
            continue
        rec.headers.get("WARC-Record-ID"), rec.headers.get("WARC-Target-URI")
        if rec.http_headers.status_code == 200:
            rec.http_headers.get("Content-Type")
            rec.reader.read()
            pages += 1
    return pages


def cpu_ms(fn, repeat: int) -> tuple[float, object]:
    runs, out = [], None
    for _ in range(repeat):
        t = time.process_time()
        out = fn()
        runs.append(1000 * (time.process_time() - t))
    return statistics.median(runs), out


def damage_rows() -> list[str]:
    from fastwarc.warc import ArchiveIterator

    from llmctl.data.crawl.warc import WarcError, iter_records

    rows = []
    for path in sorted(BAD.glob("*")):
        ours = list(iter_records(str(path)))
        errs = [i.offset for i in ours if isinstance(i, WarcError)]
        n_fw, fw_err = 0, ""
        try:
            with open(path, "rb") as f:
                for rec in ArchiveIterator(f, parse_http=True, auto_decode="all"):
                    rec.reader.read()
                    n_fw += 1
        except Exception as e:  # fastwarc raises where it stops
            fw_err = f"stops: {str(e).splitlines()[0][:50]}"
        rows.append(f"| {path.name} | {len(ours) - len(errs)} | {', '.join(map(str, errs)) or '-'} | {n_fw} | {fw_err or '-'} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warc", default=str(DEFAULT_WARC))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    warc_path = os.path.abspath(args.warc)
    from importlib.metadata import version

    gunzip, contents = cpu_ms(lambda: members(warc_path), args.repeat)
    warcio_ms, pages = cpu_ms(lambda: parse_warcio(contents), args.repeat)
    fastwarc_ms, pages_fw = cpu_ms(lambda: parse_fastwarc(io.BytesIO(b"".join(contents))), args.repeat)

    def whole():
        with open(warc_path, "rb") as f:
            return parse_fastwarc(f)

    whole_ms, pages_whole = cpu_ms(whole, args.repeat)
    per = lambda ms: f"{ms / pages:.3f}"  # noqa: E731
    cmd = " ".join([".venv-bench/bin/python", "benchmarks/warc_readers.py"] + sys.argv[1:])
    section = f"""## crawl-extract: WARC readers

`{cmd}` — {datetime.date.today()}, `nproc` = {len(os.sched_getaffinity(0))} ({cpu_name()}), input
`{os.path.relpath(warc_path, REPO)}` ({pages} HTML 200 responses; fastwarc counts {pages_fw} from the same members,
{pages_whole} reading the file alone), CPU ms per response, median of {args.repeat}. warcio {version('warcio')}, fastwarc {version('fastwarc')}.

| step | CPU ms/page |
|---|---|
| gunzip, llmctl's member reader (zlib) | {per(gunzip)} |
| records from those members, warcio (crawl-extract's parsing) | {per(warcio_ms)} |
| records from those members, fastwarc | {per(fastwarc_ms)} |
| **llmctl's reader with warcio** (gunzip + records) | **{per(gunzip + warcio_ms)}** |
| llmctl's reader with fastwarc (gunzip + records) | {per(gunzip + fastwarc_ms)} |
| fastwarc alone on the whole file (its own gunzip; no byte ranges) | {per(whole_ms)} |

Damaged files: records read and damage reported by llmctl's reader (warcio records), against
fastwarc reading each file alone.

| file | llmctl: records | llmctl: damage at byte | fastwarc: records | fastwarc |
|---|---|---|---|---|
""" + "\n".join(damage_rows()) + "\n"
    print(section)
    write_results("crawl-extract: WARC readers", section)


if __name__ == "__main__":
    main()
