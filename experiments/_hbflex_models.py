"""KV footprints of the two models of HBFlex Fig. 17/20, derived from the paper's per-token totals.

HBFlex §3.3 quotes 35 KB/token for DeepSeek-V3 and 95 KB/token for Qwen3; divided by the public layer
counts (61 and 94) that is the KV per token per layer one attention read touches. The model presets of
a later issue (DESIGN.md §5) will replace these constants.
"""

MODELS = {
    "DeepSeek-V3": {"kv_bytes_per_token": 35e3 / 61, "layers": 61},
    "Qwen3-235B": {"kv_bytes_per_token": 95e3 / 94, "layers": 94},
}

TRACES = ("swebench_miniswe_agent.csv", "mooncake_conversation.jsonl", "azure_llm_2023_code.csv")
