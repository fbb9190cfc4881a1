"""The main-text extractors crawl-extract can run on a decoded HTML page: the page's text or None.

- `trafilatura` (the default): FineWeb's extractor and settings (spec 001-data-eval §A1: favour
  precision, no comments, dedup on). Its dedup cache (paragraphs seen more than twice are dropped)
  is made fresh for each extractor object, and crawl-extract makes one per byte range, so the
  output does not depend on which worker ran which range.
- `resiliparse`: resiliparse's `extract_plain_text`, the extractor DCLM built its pool with
  (stages/crawl-extract/dclm.toml has DCLM's settings). A native (Rust) HTML parser and a
  DOM-walking main-content heuristic: an order of magnitude less CPU per page than trafilatura
  (benchmarks/RESULTS.md, ## crawl-extract), with less boilerplate removed.

Both take the same `str` (data/crawl/decode.py decided the charset), so the choice changes only the text.
"""

from __future__ import annotations

from typing import Callable

EXTRACTORS = ("trafilatura", "resiliparse")


def check_name(name: str, where: str = "extractor") -> None:
    from llmctl.errors import UsageError

    if name not in EXTRACTORS:
        raise UsageError(f"{where} must be one of {', '.join(EXTRACTORS)}, got {name!r}")


def make(cfg) -> Callable[[str], str | None]:
    """The extractor `cfg.extractor` names, bound to cfg's settings (an ExtractConfig)."""
    return _Resiliparse(cfg) if cfg.extractor == "resiliparse" else _Trafilatura(cfg)


class _Trafilatura:
    def __init__(self, cfg):
        import trafilatura
        from trafilatura.deduplication import LRU_SIZE, LRUCache

        self._extract = trafilatura.extract
        self._opts = dict(
            fast=cfg.fast,
            favor_precision=cfg.favor_precision,
            include_comments=cfg.include_comments,
            include_tables=cfg.include_tables,
            deduplicate=LRUCache(maxsize=LRU_SIZE) if cfg.deduplicate else False,
        )

    def __call__(self, html: str) -> str | None:
        return self._extract(html, **self._opts)


class _Resiliparse:
    def __init__(self, cfg):
        from resiliparse.extract.html2text import extract_plain_text

        self._extract = extract_plain_text
        self._opts = dict(
            main_content=cfg.main_content,
            preserve_formatting=cfg.preserve_formatting,
            list_bullets=cfg.list_bullets,
            alt_texts=cfg.alt_texts,
            links=cfg.links,
            form_fields=cfg.form_fields,
            noscript=cfg.noscript,
            comments=cfg.include_comments,
        )

    def __call__(self, html: str) -> str | None:
        return self._extract(html, **self._opts)


def warm_up(name: str) -> None:
    """Do once, before the workers fork, what each worker would otherwise do for itself: import
    the extractor, and for trafilatura build its justext stop-word list (~0.25 s a worker,
    measured on pages-a.warc.gz)."""
    if name == "resiliparse":
        import resiliparse.extract.html2text  # noqa: F401
        return
    import trafilatura.external

    init = getattr(trafilatura.external, "jt_stoplist_init", None)  # internal; absent in some versions
    if init is not None and getattr(trafilatura.external, "JT_STOPLIST", None) is None:
        init()
