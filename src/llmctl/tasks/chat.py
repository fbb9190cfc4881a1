"""Chat conversations `{messages: [{role, content}, ...]}`: the SFT record that is already a
conversation. Roles are system, user and assistant (the chat template, tokenizer/chat.py, renders
them); a numeric content is written out.
"""

from __future__ import annotations

from llmctl.errors import UsageError
from llmctl.tasks.base import Family, message_text

ROLES = ("system", "user", "assistant")


def conversation(rec: dict, where: str) -> list[dict] | None:
    if "messages" not in rec:
        return None
    msgs = rec["messages"]
    if not isinstance(msgs, (list, tuple)) or not msgs:
        raise UsageError(f"{where}: 'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise UsageError(f"{where}: message {i} must be an object with 'role' and 'content'")
        if m["role"] not in ROLES:
            raise UsageError(f"{where}: message {i} has role {m['role']!r} (expected system, user or assistant)")
        out.append({"role": m["role"], "content": message_text(m["content"], where, f"messages[{i}].content")})
    return out


FAMILY = Family(name="chat", order=5, conversation=conversation, conversation_shapes=("'messages'",))
