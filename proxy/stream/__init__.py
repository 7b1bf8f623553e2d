"""Pure, stateful stream transforms: one object per choice (or per response), `feed(piece)` returns what can be sent
now, `flush()` what is left when the stream ends. The caller hands each transform only the new piece; chunk
boundaries never change the result. Non-stream answers run through the same objects as one piece plus `flush()`.

- `cumulative.CumulativeText`   MindIE `fullTextEnabled` snapshots -> true deltas (holds a trailing U+FFFD back).
- `think.ThinkSplitter`         inline `<think>…</think>` -> ("reasoning", s) / ("content", s) (holds partial tags).
- `tool_calls.ToolCallNormalizer`  tool-call deltas -> SDK-safe deltas (index, id, type, name once; then arguments);
  `tool_calls.normalize_message_tool_calls` for non-stream messages.
- `text_lane.TextLane`            a plain text event repeated by template, without a JSON parse (a fast lane).
- `jsonplain.PLAIN`              the bytes a JSON string holds raw (the lane reads, the hub writes tokens by it).
- `usage.normalize_usage` / `usage.deepseek_usage_fields`  usage -> OpenAI shape + extras for metrics, and back.

May import: proxy.errors, proxy.build; the hub only as types (under TYPE_CHECKING): the hub imports this part. Pure:
no I/O, no dialect by name.
"""
