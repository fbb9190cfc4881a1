"""crawl-extract: the stage (extract.py) and what only it needs: the WARC reader (warc.py), a WARC
on stdin cut into windows (warcstream.py), charset decoding (decode.py, whatwg.py) and the HTML
text extractors (extractors.py)."""
