"""HBF parts from public specifications (issue 25): one stack each, every field with its source.

A part is what a datasheet or specification states about one HBF stack; a value it does not state is
``None`` and must be given by the user (:func:`resolve` names the option). A resolved part turns into a
:class:`hbfjax.hardware.HbfSpec` of any number of stacks (:func:`to_hbf_spec`).

Rates: the *interface* bandwidth is the stated per-stack rate at the stack's interface; the *array* rate
is what the arrays can sense, dies × read units per die × page / tR. Where the array rate is below the
interface, the arrays cannot feed it: :attr:`ResolvedPart.array_limited` says so, and the effective read
rate is the lower of the two.

Units: bytes, GB/s (1e9 B/s) per stack, µs. Imported only by the command modules (``--hbf``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hbfjax import hardware
from hbfjax.hardware import GB, KiB
from hbfjax.validate import ConfigError, require, require_int, require_real

GiB = 1024**3

# (field, the option that gives it) for the values a part may leave unstated
OPTIONS = {"t_read_us": "--t-read-us", "t_prog_us": "--t-prog-us", "read_units_per_die": "--read-units-per-die"}
NAMES = {"t_read_us": "tR", "t_prog_us": "tPROG", "read_units_per_die": "read units per die"}


@dataclass(frozen=True)
class HbfPart:
    """One HBF stack as a public source states it (``None``: not stated; ``sources`` says so)."""

    name: str
    dies_per_stack: int
    channels_per_stack: int | None
    page_bytes: int
    capacity_bytes_per_stack: int
    interface_bw_gbps_per_stack: float  # read rate at the stack's interface
    t_read_us: float | None
    t_prog_us: float | None
    read_units_per_die: int | None  # planes × subarrays: independently sensed arrays per die
    pages_per_block: int
    blocks_per_unit: int | None  # None: derived from the capacity
    pe_cycles: int
    program_bw_gbps_per_stack: float | None = None  # None: read units × page / tPROG
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)

    def __post_init__(self) -> None:
        c = f"HbfPart[{self.name}]"
        for name in ("dies_per_stack", "pages_per_block", "pe_cycles", "capacity_bytes_per_stack"):
            require_int(c, name, getattr(self, name), 1, None)
        require_int(c, "page_bytes", self.page_bytes, 512, None)
        require(self.page_bytes % 512 == 0, c, "page_bytes", self.page_bytes, "must be a multiple of 512 B (a NAND page)")
        for name in ("channels_per_stack", "read_units_per_die", "blocks_per_unit"):
            if getattr(self, name) is not None:
                require_int(c, name, getattr(self, name), 1, None)
        for name in ("interface_bw_gbps_per_stack", "t_read_us", "t_prog_us", "program_bw_gbps_per_stack"):
            value = getattr(self, name)
            if value is not None or name == "interface_bw_gbps_per_stack":
                require_real(c, name, value, 0.0, None, lo_open=True)
        if self.t_read_us is not None and self.t_prog_us is not None:
            require(self.t_prog_us >= self.t_read_us, c, "t_prog_us", self.t_prog_us,
                    f"a NAND program is slower than a read (t_read_us = {self.t_read_us})")
        missing = [f.name for f in dataclasses.fields(self) if f.name not in ("name", "sources")
                   and not dict(self.sources).get(f.name)]
        require(not missing, c, "sources", missing, "every field needs a source (or 'not stated')")

    def source(self, field_name: str) -> str:
        return dict(self.sources).get(field_name, "")


@dataclass(frozen=True)
class ResolvedPart:
    """A part with every value a command uses filled (from the part, or from the user's options)."""

    part: HbfPart
    t_read_us: float | None  # None only where the command times no read (writeback) and the part states none
    t_prog_us: float | None  # None only where the command needs no tPROG
    read_units_per_die: int
    given: tuple[str, ...] = ()  # the fields the user's options set

    @property
    def name(self) -> str:
        return self.part.name

    @property
    def units_per_stack(self) -> int:
        """Independently sensed arrays per stack: dies × read units per die."""
        return self.part.dies_per_stack * self.read_units_per_die

    @property
    def blocks_per_unit(self) -> int:
        if self.part.blocks_per_unit is not None:
            return self.part.blocks_per_unit
        return self.part.capacity_bytes_per_stack // (self.units_per_stack * self.part.pages_per_block
                                                      * self.part.page_bytes)

    @property
    def array_read_gbps_per_stack(self) -> float:
        """dies × read units per die × page / tR, GB/s per stack."""
        return self.units_per_stack * self.part.page_bytes / (self.t_read_us * 1e3)

    @property
    def interface_gbps_per_stack(self) -> float:
        return self.part.interface_bw_gbps_per_stack

    @property
    def array_limited(self) -> bool:
        """The arrays cannot feed the interface (array rate below the stated bandwidth)."""
        return self.array_read_gbps_per_stack < self.interface_gbps_per_stack

    @property
    def read_gbps_per_stack(self) -> float:
        """Effective read rate: min(array, interface)."""
        return min(self.array_read_gbps_per_stack, self.interface_gbps_per_stack)

    @property
    def program_gbps_per_stack(self) -> float | None:
        """The stated program rate, else read units × page / tPROG (GB/s per stack); None without tPROG."""
        if self.part.program_bw_gbps_per_stack is not None:
            return self.part.program_bw_gbps_per_stack
        if self.t_prog_us is None:
            return None
        return self.units_per_stack * self.part.page_bytes / (self.t_prog_us * 1e3)

    def source(self, field_name: str) -> str:
        if field_name in self.given:
            return f"given: {OPTIONS[field_name]}"
        return self.part.source(field_name)

    def report(self, include_reads: bool = True) -> dict:
        """The ``hbf_part`` object of a command's JSON: every value used with its source, the rates, and a
        note where the arrays cannot feed the interface; without ``include_reads`` (a command that times no
        read: writeback) neither tR nor the read rates."""
        p = self.part
        values = {"dies_per_stack": p.dies_per_stack, "channels_per_stack": p.channels_per_stack,
                  "page_bytes": p.page_bytes, "capacity_bytes_per_stack": p.capacity_bytes_per_stack,
                  "interface_bw_gbps_per_stack": p.interface_bw_gbps_per_stack, "t_read_us": self.t_read_us,
                  "t_prog_us": self.t_prog_us, "read_units_per_die": self.read_units_per_die,
                  "pages_per_block": p.pages_per_block, "blocks_per_unit": self.blocks_per_unit,
                  "pe_cycles": p.pe_cycles, "program_bw_gbps_per_stack": self.program_gbps_per_stack}
        not_stated = [k for k, v in values.items() if v is None]  # not stated, and not used by the command
        values = {k: v for k, v in values.items() if v is not None}
        sources = {k: self.source(k) for k in values}
        if p.blocks_per_unit is None:
            sources["blocks_per_unit"] = ("derived: capacity / (dies × read units per die × pages per block × page) "
                                          "= " + str(self.blocks_per_unit))
        if p.program_bw_gbps_per_stack is None and self.program_gbps_per_stack is not None:
            sources["program_bw_gbps_per_stack"] = (f"derived: dies × read units per die × page / tPROG = "
                                                    f"{self.program_gbps_per_stack:.6g} GB/s")
        out = {"name": self.name, "values": values, "sources": sources, "not_stated_unused": not_stated}
        if not include_reads:
            values.pop("t_read_us", None)
            sources.pop("t_read_us", None)
            return out
        out |= {"array_read_gbps_per_stack": self.array_read_gbps_per_stack,
               "interface_gbps_per_stack": self.interface_gbps_per_stack,
               "read_gbps_per_stack": self.read_gbps_per_stack, "array_limited": self.array_limited}
        if self.array_limited:
            out["note"] = (f"the arrays cannot feed the interface: {self.units_per_stack} units × {p.page_bytes} B / "
                           f"{self.t_read_us:g} µs = {self.array_read_gbps_per_stack:.6g} GB/s per stack, below the "
                           f"stated {self.interface_gbps_per_stack:g} GB/s, so reads run at the array rate")
        return out


def _unstated(ns: str) -> tuple:
    """The sources of the fields a public HBF description leaves open (``ns``: "not stated (where)")."""
    return (("t_read_us", f"{ns}: required, --t-read-us"), ("t_prog_us", f"{ns}: required, --t-prog-us"),
            ("read_units_per_die", f"{ns}: required, --read-units-per-die"),
            ("pages_per_block", f"assumed: 512 as HBFlex §3; {ns}"),
            ("blocks_per_unit", f"{ns}: derived from the capacity"),
            ("pe_cycles", f"assumed: SLC-class 100K as HBFlex §3.3; {ns}"),
            ("program_bw_gbps_per_stack", f"{ns}: read units × page / tPROG"))


def _ocp() -> HbfPart:
    src = "OCP HBF specification v0.7 (2026-08)"
    ns = f"not stated ({src})"
    return HbfPart(
        name="ocp-hbf-v0.7", dies_per_stack=16, channels_per_stack=16, page_bytes=4 * KiB,
        capacity_bytes_per_stack=512 * GiB, interface_bw_gbps_per_stack=3072.0, t_read_us=None, t_prog_us=None,
        read_units_per_die=None, pages_per_block=512, blocks_per_unit=None, pe_cycles=100_000,
        sources=(("dies_per_stack", f"{src}: 16 dies"), ("channels_per_stack", f"{src}: 16 channels"),
                 ("page_bytes", f"{src}: 4 KiB pages"), ("capacity_bytes_per_stack", f"{src}: 512 GiB"),
                 ("interface_bw_gbps_per_stack", f"{src}: 3,072 GB/s per cube at the interface"),
                 *_unstated(ns)),
    )


def _sandisk() -> HbfPart:
    src = "SanDisk first-generation HBF (public description, 2025)"
    ns = f"not stated ({src})"
    return HbfPart(
        name="sandisk-gen1", dies_per_stack=16, channels_per_stack=None, page_bytes=4 * KiB,
        capacity_bytes_per_stack=512 * GB, interface_bw_gbps_per_stack=1600.0, t_read_us=None, t_prog_us=None,
        read_units_per_die=None, pages_per_block=512, blocks_per_unit=None, pe_cycles=100_000,
        sources=(("dies_per_stack", "SemiEngineering 2025, 'Flash Getting Stacked High-Bandwidth Version': "
                                    "a 16-die-plus-base-die flash stack"),
                 ("channels_per_stack", ns), ("page_bytes", f"assumed: 4 KiB as the OCP HBF v0.7 specification; {ns}"),
                 ("capacity_bytes_per_stack", f"{src}: 512 GB per stack"),
                 ("interface_bw_gbps_per_stack", f"{src}: 1.6 TB/s per stack"),
                 *_unstated(ns)),
    )


def _slc_96l() -> HbfPart:
    h = hardware.preset("hbflex").hbf  # today's hbflex preset: one of its six stacks
    src = "HBFlex §3 and §6.1"
    slc = "96-layer SLC attribution: issue 25"
    return HbfPart(
        name="slc-96l", dies_per_stack=h.dies_per_stack, channels_per_stack=None, page_bytes=h.page_bytes,
        capacity_bytes_per_stack=h.capacity_bytes // h.stacks, interface_bw_gbps_per_stack=h.read_bw_gbps_per_stack,
        t_read_us=h.t_read_us, t_prog_us=h.t_prog_us, read_units_per_die=h.planes_per_die * h.subarrays_per_plane,
        pages_per_block=h.pages_per_block, blocks_per_unit=h.blocks_per_plane, pe_cycles=h.pe_cycles,
        program_bw_gbps_per_stack=h.write_bw_gbps_per_stack,
        sources=(("dies_per_stack", src), ("channels_per_stack", f"not stated ({src})"),
                 ("page_bytes", "HBFlex §2.1"),
                 ("capacity_bytes_per_stack", f"{src}: 16 dies × 32 planes × 512 blocks × 512 pages × 4 KiB"),
                 ("interface_bw_gbps_per_stack", f"{src}: 488 GB/s per stack read"),
                 ("t_read_us", f"{src}: tR 4 µs ({slc})"), ("t_prog_us", f"{src}: tPROG 75 µs ({slc})"),
                 ("read_units_per_die", f"{src}: 32 planes per die"), ("pages_per_block", src),
                 ("blocks_per_unit", src), ("pe_cycles", "HBFlex §3.3 (100K P/E budget)"),
                 ("program_bw_gbps_per_stack", "HBFlex §6.1: 27.2 GB/s per stack program")),
    )


PARTS = {"ocp-hbf-v0.7": _ocp, "sandisk-gen1": _sandisk, "slc-96l": _slc_96l}


def part(name: str) -> HbfPart:
    try:
        return PARTS[name]()
    except KeyError:
        raise ConfigError(f"--hbf {name}: unknown part; choose one of {tuple(PARTS)}") from None


def resolve(name: str, *, t_read_us=None, t_prog_us=None, read_units_per_die=None,
            need: tuple[str, ...] = ("t_read_us", "read_units_per_die")) -> ResolvedPart:
    """The part with the user's values filling (or overriding) what it states; a ``ConfigError`` of one line
    naming the option when a value in ``need`` is neither stated nor given, or when tPROG < tR."""
    p = part(name)
    user = {"t_read_us": t_read_us, "t_prog_us": t_prog_us, "read_units_per_die": read_units_per_die}
    values = {k: (v if v is not None else getattr(p, k)) for k, v in user.items()}
    for k in ("t_read_us", "t_prog_us", "read_units_per_die"):
        if k in need and values[k] is None:
            raise ConfigError(f"--hbf {name} states no {NAMES[k]}: give {OPTIONS[k]}")
    if values["t_read_us"] is not None and values["t_prog_us"] is not None and values["t_prog_us"] < values["t_read_us"]:
        given = " and ".join(f"{OPTIONS[k]} = {v:g}" for k, v in user.items() if v is not None and k != "read_units_per_die")
        raise ConfigError(f"--hbf {name}{': ' + given if given else ''}: tPROG {values['t_prog_us']:g} µs < tR "
                          f"{values['t_read_us']:g} µs; a NAND program is slower than a read")
    r = ResolvedPart(part=p, t_read_us=None if values["t_read_us"] is None else float(values["t_read_us"]),
                     t_prog_us=None if values["t_prog_us"] is None else float(values["t_prog_us"]),
                     read_units_per_die=int(values["read_units_per_die"]),
                     given=tuple(k for k, v in user.items() if v is not None))
    if r.blocks_per_unit < 1:
        raise ConfigError(f"--hbf {name}: {r.units_per_stack} units × {p.pages_per_block} pages × {p.page_bytes} B "
                          f"exceed the {p.capacity_bytes_per_stack} B per stack; give fewer --read-units-per-die")
    return r


def org_changes(r: ResolvedPart) -> tuple:
    """``OrgKnobs.make`` changes that put the part in each HBF stack of an organisation (per stack: read units,
    page, tR, tPROG, capacity, the interface's read rate and the program rate; the organisation keeps its stack
    count, links and SRAM regions)."""
    changes = (("parallel_units", r.units_per_stack), ("page_bytes", r.part.page_bytes), ("t_read_us", r.t_read_us),
               ("t_prog_us", r.t_prog_us), ("hbf_capacity_bytes", float(r.part.capacity_bytes_per_stack)),
               ("hbf_interface_gbps", float(r.interface_gbps_per_stack)))
    program = r.program_gbps_per_stack
    return changes if program is None else changes + (("hbf_write_gbps", float(program)),)


def to_hbf_spec(r: ResolvedPart, stacks: int = 1, *, sram_bytes_per_stack: int = 0) -> hardware.HbfSpec:
    """``stacks`` stacks of the part as an ``HbfSpec`` (read units as planes, one subarray each; the read rate
    the effective min(array, interface)). Without tPROG (a reads-only command) tPROG is set to tR, unused."""
    p = r.part
    t_prog = r.t_read_us if r.t_prog_us is None else r.t_prog_us
    src = lambda k: r.source(k)  # noqa: E731
    return hardware.HbfSpec(
        stacks=stacks, dies_per_stack=p.dies_per_stack, planes_per_die=r.read_units_per_die,
        blocks_per_plane=r.blocks_per_unit, pages_per_block=p.pages_per_block, page_bytes=p.page_bytes,
        t_read_us=r.t_read_us, t_prog_us=t_prog, sram_bytes_per_stack=sram_bytes_per_stack,
        read_bw_gbps_per_stack=r.read_gbps_per_stack, write_bw_gbps_per_stack=p.program_bw_gbps_per_stack,
        pe_cycles=p.pe_cycles,
        sources=(("stacks", "given: --hbf-stacks (default 1)"), ("dies_per_stack", src("dies_per_stack")),
                 ("planes_per_die", src("read_units_per_die")), ("blocks_per_plane", src("blocks_per_unit")),
                 ("pages_per_block", src("pages_per_block")), ("page_bytes", src("page_bytes")),
                 ("t_read_us", src("t_read_us")),
                 ("t_prog_us", src("t_prog_us") if r.t_prog_us is not None else "unused: reads only, set to tR"),
                 ("read_bw_gbps_per_stack", "min(array rate, interface bandwidth)"),
                 ("pe_cycles", src("pe_cycles"))),
    )
