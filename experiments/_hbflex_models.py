"""KV footprints of the two models of HBFlex Fig. 5/17/20, from the model presets at HBFlex's KV precision.

HBFlex §3.3 quotes 35 KB/token for DeepSeek-V3 and 95 KB/token for Qwen3 (one byte per KV element);
the presets derive 35.1 and 96.3 KB (``hbfjax models --kv-bytes-per-element 1``). ``kv_bytes_per_token``
here is per layer: what one attention read of one layer touches.
"""

from hbfjax.workload import models


def _footprint(name: str) -> dict:
    spec = models.preset(name).with_kv_precision(models.HBFLEX_KV_BYTES_PER_ELEMENT)
    return {"kv_bytes_per_token": spec.kv_bytes_per_token_layer, "layers": spec.layers}


MODELS = {"DeepSeek-V3": _footprint("deepseek-v3"), "Qwen3-235B": _footprint("qwen3-235b-a22b")}

TRACES = ("swebench_miniswe_agent.csv", "mooncake_conversation.jsonl", "azure_llm_2023_code.csv")
