"""A sample's text as it streams: the engine hands over token ids; a client gets text deltas that
concatenate to exactly the text of the whole answer.

After each step the ids so far are decoded and only what is new is sent — minus a tail that may
still change: an incomplete UTF-8 character (a byte-level token can end mid-character, which
decodes to U+FFFD until the next token completes it) and the longest end of the text that begins
a stop string (if the string completes, the answer is cut before it, and what was sent cannot be
taken back). When the sample ends, the rest of its final text (the engine's, cut at a stop
string) is sent.
"""

from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"  # what the decoder writes for bytes that are not (yet) a whole character


class DeltaText:
    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()):
        self.decode, self.stop = decode, tuple(stop)
        self.ids: list[int] = []
        self.sent = ""

    def add(self, new_ids: list[int]) -> str:
        """The text that is now certain, past what was sent."""
        if not new_ids:
            return ""
        self.ids.extend(new_ids)
        text = self.decode(self.ids)
        end = len(text)
        while end > len(self.sent) and text[end - 1] == REPLACEMENT:
            end -= 1
        end -= held_for_stop(text[:end], self.stop)
        if end <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) : end], text[:end]
        return delta

    def finish(self, final: str) -> str:
        """What remains to send of the sample's final text."""
        rest = final[len(self.sent) :] if final.startswith(self.sent) else ""
        self.sent = final if final.startswith(self.sent) else self.sent
        return rest


def held_for_stop(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of `text` that are the beginning of a stop string (the longest such end)."""
    held = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:k]):
                held = k
                break
    return held
