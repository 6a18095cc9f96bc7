"""HBF parts from public specifications (issue 25): sources, refusals, rates, and --hbf on the commands."""

import dataclasses
import json

import pytest

from hbfjax import cli, hardware
from hbfjax.memory import hbf_parts
from hbfjax.validate import ConfigError


def test_every_field_of_every_part_has_a_source():
    for name in hbf_parts.PARTS:
        p = hbf_parts.part(name)
        for f in dataclasses.fields(p):
            if f.name not in ("name", "sources"):
                assert p.source(f.name), (name, f.name)


def test_ocp_refuses_without_tr_and_read_units_naming_the_options():
    with pytest.raises(ConfigError, match=r"^--hbf ocp-hbf-v0.7 states no tR: give --t-read-us$"):
        hbf_parts.resolve("ocp-hbf-v0.7", read_units_per_die=32)
    with pytest.raises(ConfigError, match=r"^--hbf ocp-hbf-v0.7 states no read units per die: give --read-units-per-die$"):
        hbf_parts.resolve("ocp-hbf-v0.7", t_read_us=4.0)
    with pytest.raises(ConfigError, match="give --t-prog-us"):
        hbf_parts.resolve("ocp-hbf-v0.7", t_read_us=4.0, read_units_per_die=32, need=("t_read_us", "t_prog_us"))


def test_array_rate_by_hand_and_array_limited():
    r = hbf_parts.resolve("slc-96l")
    assert r.array_read_gbps_per_stack == pytest.approx(16 * 32 * 4096 / 4e-6 / 1e9)  # 524.288 GB/s
    assert r.array_read_gbps_per_stack == pytest.approx(524.288)
    assert not r.array_limited and r.read_gbps_per_stack == 488.0
    slow = hbf_parts.resolve("ocp-hbf-v0.7", t_read_us=4.0, read_units_per_die=32)  # 524.288 < 3,072 GB/s
    assert slow.array_limited and slow.read_gbps_per_stack == pytest.approx(524.288) and "note" in slow.report()
    fast = hbf_parts.resolve("ocp-hbf-v0.7", t_read_us=0.5, read_units_per_die=32)  # 4,194.3 > 3,072 GB/s
    assert not fast.array_limited and fast.read_gbps_per_stack == 3072.0 and "note" not in fast.report()
    assert slow.blocks_per_unit == 512  # 512 GiB / (16 × 32 × 512 pages × 4 KiB)


def test_org_changes_carry_the_interface_and_the_program_rate():
    slc = dict(hbf_parts.org_changes(hbf_parts.resolve("slc-96l")))
    assert slc["hbf_interface_gbps"] == 488.0 and slc["hbf_write_gbps"] == 27.2  # stated by HBFlex §6.1
    assert slc["parallel_units"] == 512 and slc["t_prog_us"] == 75.0
    # OCP states no program rate: 16 dies × 32 units × 4 KiB / 75 µs = 27.962 GB/s per stack
    ocp = dict(hbf_parts.org_changes(hbf_parts.resolve("ocp-hbf-v0.7", t_read_us=4.0, t_prog_us=75.0,
                                                       read_units_per_die=32)))
    assert ocp["hbf_write_gbps"] == pytest.approx(16 * 32 * 4096 / 75e-6 / 1e9) and ocp["hbf_interface_gbps"] == 3072.0
    reads_only = hbf_parts.resolve("ocp-hbf-v0.7", t_read_us=4.0, read_units_per_die=32)
    assert "hbf_write_gbps" not in dict(hbf_parts.org_changes(reads_only))


def _json(capsys, argv):
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_collide_slc96l_equals_the_hbflex_preset(capsys):
    # rule: planes = --hbf-stacks × dies × read units per die; hbflex is six stacks of slc-96l
    spec = hbf_parts.to_hbf_spec(hbf_parts.resolve("slc-96l"), 6)
    h = hardware.preset("hbflex").hbf
    assert (spec.parallel_units, spec.t_read_us, spec.page_bytes, spec.read_bw_gbps) == (
        h.parallel_units, h.t_read_us, h.page_bytes, h.read_bw_gbps)
    base = ["collide", "--pages", "512", "--streams", "8", "--json"]
    a = _json(capsys, base + ["--hbf", "slc-96l", "--hbf-stacks", "6"])
    b = _json(capsys, base + ["--preset", "hbflex"])
    assert a.pop("hbf_part")["name"] == "slc-96l" and a == b
    one = _json(capsys, base + ["--hbf", "slc-96l"])
    assert one["planes"] == h.parallel_units // h.stacks == 512


def test_serve_with_a_part_reports_it(capsys):
    d = _json(capsys, ["serve", "--system", "dash", "--hbf", "slc-96l", "--model", "mixtral-8x22b", "--batch", "1",
                       "--prompt", "64", "--output", "4", "--streams", "2", "--json"])
    assert d["hbf_part"]["name"] == "slc-96l" and d["hbf_part"]["values"]["t_read_us"] == 4.0
    assert d["hbf_part"]["array_limited"] is False and d["throughput_tokens_per_s"] > 0


@pytest.mark.parametrize("argv, text", [
    (["collide", "--hbf", "nope"], "invalid choice"),
    (["collide", "--hbf", "ocp-hbf-v0.7", "--read-units-per-die", "32"], "give --t-read-us"),
    (["collide", "--hbf", "ocp-hbf-v0.7", "--t-read-us", "4"], "give --read-units-per-die"),
    (["collide", "--hbf", "slc-96l", "--preset", "hbflex"], "give one"),
    (["collide", "--read-units-per-die", "32"], "applies only with --hbf"),
    (["gc", "--hbf", "sandisk-gen1", "--t-read-us", "4", "--read-units-per-die", "32"], "give --t-prog-us"),
    (["gc", "--hbf", "slc-96l", "--t-prog-us", "3"], "a NAND program is slower than a read"),
    (["serve", "--system", "dash", "--hbf", "ocp-hbf-v0.7", "--t-read-us", "4", "--t-prog-us", "2",
      "--read-units-per-die", "32"], "a NAND program is slower than a read"),
    (["serve", "--system", "h3", "--hbf", "slc-96l"], "not one whole stack"),
])
def test_bad_options_are_one_line_and_exit_2(capsys, argv, text):
    assert cli.main(argv + ["--streams", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and text in err


def test_writeback_hbf_slc_96l_equals_the_hbflex_preset(capsys):
    """`writeback --hbf slc-96l` builds the hbflex preset's package (6 stacks of the part): the same numbers."""
    runs = []
    for extra in (["--hbf", "slc-96l"], []):
        assert cli.main(["writeback", "--streams", "4", "--iterations", "20", "--json", *extra]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    part = runs[0].pop("hbf_part")
    assert part["stacks"] == 6 and "t_read_us" not in part["values"]
    assert runs[0] == runs[1]
