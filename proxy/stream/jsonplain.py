"""`PLAIN`: a byte table that changes exactly the bytes a JSON string cannot hold raw: U+0000-U+001F, the quote, the
backslash (UTF-8 multi-byte sequences hold none of them). A text's UTF-8 that `translate(PLAIN)` gives back as the
very same object is that JSON string's content as it stands.

Here, below the hub, because both sides use it: the text lane (proxy/stream/text_lane.py) to read a token without a
JSON parse, the hub's JSON text helpers (proxy/hub/jsontext.py) to write one without orjson.
"""

from __future__ import annotations

from typing import Final

PLAIN: Final = bytes(0xFF if b < 0x20 or b in (0x22, 0x5C) else b for b in range(256))
