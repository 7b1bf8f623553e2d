"""dialect-proxy: OpenAI Chat Completions, Completions, Responses and Anthropic Messages in front of MindIE,
Siliconstorm, DeepSeek, engine-API, OpenAI and vLLM upstreams; embeddings and rerank in front of
text-embeddings-inference (TEI), vLLM and OpenAI."""

__version__ = "0.1.0"
