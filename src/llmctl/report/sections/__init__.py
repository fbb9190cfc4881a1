"""One module per stage; each turns the lineage's artifacts of that stage into report sections, from
their own manifests and files only. A stage that is not in the lineage gives no section."""

from __future__ import annotations

from llmctl.report.collect import Lineage
from llmctl.report.page import Section
from llmctl.report.sections import crawl, dedup, eval, filter, rl, scaling, tokenize, totals, train
from llmctl.report.sections.common import Images

ORDER = (crawl, filter, dedup, tokenize, train, eval, rl, scaling, totals)


def build_sections(lineage: Lineage, images: Images) -> list[Section]:
    return [s for module in ORDER for s in module.sections(lineage, images)]
