import pytest

from hbfjax.hardware import KiB, MiB, HbfSpec, SpecError, preset


def test_hbflex_preset_matches_paper_configuration():
    hbf = preset("hbflex").hbf
    assert hbf.planes == 3072  # 6 stacks × 16 dies × 32 planes (HBFlex §3)
    assert hbf.read_bw_gbps == pytest.approx(6 * 488.0)  # 2.93 TB/s (HBFlex §3)
    assert hbf.write_bw_gbps == pytest.approx(6 * 27.2)
    # 512 planes × 4 KiB / 4 µs per stack ≈ 524 GB/s array rate, above the 488 GB/s interface (DESIGN §4)
    assert hbf.array_read_bw_gbps / hbf.stacks == pytest.approx(512 * 4096 / 4e3)
    assert hbf.capacity_bytes == 3072 * 512 * 512 * 4 * KiB
    assert "HBFlex" in hbf.source("t_prog_us")


def test_dash_preset_page_wave_is_8_mib_per_stack():
    system = preset("dash")
    assert system.hbf.parallel_units == 2 * 16 * 32 * 4
    assert system.hbf.page_wave_bytes == 2 * 8 * MiB  # DASH §VI-A: 8 MiB per stack, 16 MiB for two
    assert system.hbf.sram_bytes_per_stack // system.hbf.sram_regions_per_stack == 8 * MiB
    assert system.hbm.capacity_bytes == 48 * 10**9
    assert system.hbm.relay_sram_bytes_per_stack // system.hbm.relay_sram_regions_per_stack == 4 * MiB
    assert abs(system.hbf.capacity_bytes / system.hbf.stacks - 512e9) / 512e9 < 0.01


@pytest.mark.parametrize("field,value,rule", [
    ("t_read_us", 0.0, "must be > 0"),
    ("planes_per_die", -1, "must be > 0"),
    ("page_bytes", 1000, "multiple of 512"),
    ("t_prog_us", 1.0, "slower than a read"),
    ("sram_regions_per_stack", 3, "equal regions"),
])
def test_bad_values_name_field_value_and_rule(field, value, rule):
    with pytest.raises(SpecError) as err:
        preset("hbflex").hbf.replace(**{field: value})
    message = str(err.value)
    assert f"HbfSpec.{field} = {value!r}" in message and rule in message


def test_specs_are_hashable_static_config():
    a, b = preset("hbflex").hbf, preset("hbflex").hbf
    assert hash(a) == hash(b) and a == b
    assert a != a.replace(t_read_us=5.0)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(SpecError, match="dash"):
        preset("nope")


def test_spec_constructed_directly_is_validated():
    with pytest.raises(SpecError, match="stacks"):
        HbfSpec(stacks=0, dies_per_stack=1, planes_per_die=1, blocks_per_plane=1, pages_per_block=1,
                page_bytes=4096, t_read_us=1, t_prog_us=10, sram_bytes_per_stack=0)
