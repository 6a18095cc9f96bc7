"""Flash lifetime from write amplification: DASH §VI-H formula and the HBFlex §3.3 budget.

Both return a dict with every input of the formula beside the result, so a reader can check it.
Units: bytes, seconds, days; years are 365.25 days; TB = 1e12 B (as the papers).
"""

from __future__ import annotations

import math

from hbfjax.validate import ConfigError

SECONDS_PER_YEAR = 365.25 * 86400.0
DAYS_PER_YEAR = 365.25


def _positive(**values) -> None:
    for name, v in values.items():
        if not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"{name} = {v!r}: must be finite and > 0")


def dash_lifetime(kv_capacity_bytes: float, pe_cycles: float, waf: float, write_bytes_per_s: float,
                  utilization: float = 1.0) -> dict:
    """DASH §VI-H: Lifetime = C_KV·E_SLC / (A_W·R_HBF·u), in seconds and years.

    C_KV: HBF capacity holding KV (bytes); E_SLC: P/E cycles per block; A_W: write amplification;
    R_HBF: host KV write rate into HBF while serving (B/s); u: fraction of time spent serving.
    """
    _positive(kv_capacity_bytes=kv_capacity_bytes, pe_cycles=pe_cycles, waf=waf,
              write_bytes_per_s=write_bytes_per_s, utilization=utilization)
    seconds = kv_capacity_bytes * pe_cycles / (waf * write_bytes_per_s * utilization)
    return {"formula": "C_KV * E_SLC / (A_W * R_HBF * u)", "C_KV_bytes": kv_capacity_bytes,
            "E_SLC_pe_cycles": pe_cycles, "A_W_waf": waf, "R_HBF_bytes_per_s": write_bytes_per_s,
            "u_utilization": utilization, "lifetime_s": seconds, "lifetime_years": seconds / SECONDS_PER_YEAR}


def hbflex_budget(capacity_bytes: float, pe_cycles: float, years: float, daily_write_bytes: float,
                  waf: float = 1.0) -> dict:
    """HBFlex §3.3: the write budget P/E × capacity / (years × 365.25) per day, the share raw KV writes
    use, the WAF margin left (budget / raw writes), and the lifetime at the given WAF.

    The paper's example: 1 TB, 100K P/E, 5 years → ≈ 54.8 TB/day; DeepSeek-V3 8.37 TB/day per GPU
    uses 15.3 % of it, leaving ≈ 6.5× room for write amplification.
    """
    _positive(capacity_bytes=capacity_bytes, pe_cycles=pe_cycles, years=years,
              daily_write_bytes=daily_write_bytes, waf=waf)
    budget = pe_cycles * capacity_bytes / (years * DAYS_PER_YEAR)
    lifetime_years = pe_cycles * capacity_bytes / (daily_write_bytes * waf * DAYS_PER_YEAR)
    return {"formula": "P/E * capacity / (years * 365.25 days)", "capacity_bytes": capacity_bytes,
            "pe_cycles": pe_cycles, "years": years, "daily_write_bytes": daily_write_bytes, "waf": waf,
            "budget_bytes_per_day": budget, "raw_share_of_budget": daily_write_bytes / budget,
            "waf_margin": budget / daily_write_bytes, "lifetime_years": lifetime_years}


def daily_kv_write_bytes(tokens_per_day: float, kv_bytes_per_token: float, gpus: float) -> float:
    """New-KV bytes written per GPU per day (HBFlex §3.3: 434B tokens/day × 35 KB/token / 1,814 GPUs)."""
    _positive(tokens_per_day=tokens_per_day, kv_bytes_per_token=kv_bytes_per_token, gpus=gpus)
    return tokens_per_day * kv_bytes_per_token / gpus
