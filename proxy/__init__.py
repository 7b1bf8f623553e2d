"""dialect-proxy: an OpenAI Chat Completions front for MindIE, Siliconstorm, DeepSeek and engine upstreams."""

__version__ = "0.1.0"
