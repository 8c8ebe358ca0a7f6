"""kimi-audit: audit Kimi-K2 / DeepseekV3 safetensors checkpoints from their headers."""

__version__ = "0.1.0"
