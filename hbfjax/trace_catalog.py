"""The public request traces the project uses, where each is published, its licence and checksums.

Every entry is pinned to one upstream commit, so ``hbfjax traces fetch`` downloads exactly the bytes
the project was checked against (``https://raw.githubusercontent.com/OWNER/REPO/COMMIT/PATH``) and
verifies each file's SHA-256 before keeping it. The traces are data, never part of the repository:
they live in ``../shared/traces`` beside a checkout (CI) or in the per-user data folder (a user's
clone, after ``hbfjax traces fetch``). Values were measured on the upstream git snapshots named in
``sources``; sizes in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hbfjax.validate import ConfigError

RAW_GITHUB = "https://raw.githubusercontent.com"


@dataclass(frozen=True)
class UpstreamFile:
    """One published file: its path in the upstream repository, size (bytes) and SHA-256 (hex)."""

    path: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class TraceSource:
    """A catalogued trace.

    ``local`` is what ``fetch`` writes into the trace folder: the upstream file under that name, or,
    for a trace published as several files, a folder of that name holding them (flat, upstream names).
    ``aliases`` are other names the project reads the same trace by (a derived copy such as the
    shared SWE-bench CSV); a bare name is looked up under ``local`` and every alias.
    """

    name: str  # what `hbfjax traces fetch NAME` takes
    title: str
    repo: str  # "OWNER/REPO" on GitHub
    commit: str  # 40 hex digits, pinned in the download URL
    files: tuple[UpstreamFile, ...]
    local: str
    licence: str
    attribution: str
    aliases: tuple[str, ...] = ()
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)

    @property
    def is_folder(self) -> bool:
        """Published as several files: fetched into the folder ``local``."""
        return len(self.files) > 1

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    def url(self, file: UpstreamFile, base_url: str = RAW_GITHUB) -> str:
        """Download address of ``file`` at the pinned commit under ``base_url`` (raw GitHub layout)."""
        return f"{base_url.rstrip('/')}/{self.repo}/{self.commit}/{file.path}"

    def names(self) -> tuple[str, ...]:
        """Every name this trace answers to: catalogue name, local name, aliases."""
        return (self.name, self.local, *self.aliases)


_SNAPSHOT = "measured 2026-12-01 on the upstream git snapshot (git show COMMIT:PATH | sha256sum)"

_MINISWE_FILES = (
    ("063925220f0d2954505eb37612b11ab3", 561614, "58a48008ded2d551f55ed9414351c9191ba9ff84b16f65718c07edfeefd10fae"),
    ("07c6a78a27294b41a7c09a1907af143d", 691884, "a5fda6361b9402a2beec17a4b99ff5075401ef360193f25ca1a7c0027593dbcd"),
    ("0d858f596973e20b4e8a66cc6d7efb8d", 522689, "421f3242b36f9089f0153b89c0335d8ab7a145e4f0dc7ffedbf269e2238e2fe9"),
    ("189f0222310bd8eee310f204e91b9c84", 36666, "df8e61ad8e072e77858755a5853ad9b6cccebe40a54135636a28d9801f114d45"),
    ("2e9e99a583d052783791ec77ebb905a2", 130664, "b8965283787d03952c9b2864d9ee0cd34283740232852680b541ce1124f052ba"),
    ("39f322b016f240b738243a425ddd8049", 95032, "4ba19873444858a9f7ffbeac08f4d6ab78f7a322410c3eaa5ac7740ff113a396"),
    ("5518cbf6b5c90e74800c7cdaf91da2f7", 448887, "5d8bd7c109f969deb1175b906caf3eb316ce8e952afaf13ebaf3ba6dd0978188"),
    ("5a8530b10dedc4c0ab526343f4ddc7ff", 604951, "66eb668b4c5044497d7183a35d1b30cf57214e82ff8ec2426d15797a15c1ee2a"),
    ("5e964bd93f8c35ab4430fd68b91abf13", 478267, "8640d57a4cd298eeacb593949ede03d1f13f5f53db733fe01742b6f6b166fdf9"),
    ("6f1a88fc2fa796cf515b263d8f5f55c4", 722683, "4452189de9c9f71345b121eb71cec3b6db1ca4b8700c937ddd1acc35892cf21f"),
    ("8f7920a28c54ae83dadb6d0a8e6cbd74", 107796, "518147fe4c6dac47b3921c5fd811fc1c24716dd1a05459514305db4e162d844d"),
    ("abe6103153a804525aa167d60cc30912", 97571, "5ac57367b6430f5c477f289ee022efccfb01c752f41ddc824116d1ba3f71299a"),
    ("ae5bc34ffaf6e553cc320e6499db0d47", 76322, "a679c58ed4ab5ef07e5a0b4063f9e98ab93c3f670f182f8cabe69b461e7c4230"),
    ("af281d036d49269c17d2638bed5e5158", 2155427, "b8ccbae2f68c89a2fc25a856e3e9dff01a98f1500956da65f1a978bda5752364"),
    ("ba443702286bd3610b74b264aaf2b6a3", 2492841, "9e7ffa3b06fc8f257b4b1e49545797bf66ec5d9d2c58340ebe27bdbdfebbc085"),
    ("c7d0fc25aec9ae6e509fb167782bbe54", 59446, "49b9959b7689b2d26630aa20accaa550d24a738c61d3e935bb83d391a5a9561a"),
    ("c9a69aa29bb95747980705c2ac0012cc", 183424, "653026a8ee3b79e6e9dbadb1c31b8a754fc69346ac5027985d2989186b050f96"),
    ("ce5308d303aa2043af2fdc79cf92ff71", 456336, "77748554f35f8cdd439a21879aa9e3eed9a60f3337333101494143e52ad30d06"),
    ("d80534b26b1c83c2c3bcf6be4ca2eb0e", 139054, "b08ad1880f1c5b87d3831e7bb7e2598ed7d8229e5865bc415d8adb58138ced52"),
    ("dc4b66869afd786bc4b341ef1119ca53", 138040, "a4b8174840b4ddffb60524e99969de3ea5d4abb2d1c2e018c8957de390c43568"),
)

CATALOG: tuple[TraceSource, ...] = (
    TraceSource(
        name="azure_llm_2023_code",
        title="Azure LLM inference trace 2023, coding service (8,819 requests, about 1 hour)",
        repo="Azure/AzurePublicDataset",
        commit="790921015d50dd6aae7f7e47f39ba0e235ad6b08",
        files=(UpstreamFile("data/AzureLLMInferenceTrace_code.csv", 320117,
                            "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6"),),
        local="azure_llm_2023_code.csv",
        licence="CC BY 4.0",
        attribution='"Azure Public Dataset"; the dataset asks publications to cite Patel et al., '
                    '"Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024',
        sources=(("commit", "last commit touching the file (2024-03-24); " + _SNAPSHOT),
                 ("licence", "AzurePublicDataset LICENSE and AzureLLMInferenceDataset2023.md"),
                 ("sha256", "byte-identical to ../shared/traces/azure_llm_2023_code.csv")),
    ),
    TraceSource(
        name="mooncake_conversation",
        title="Mooncake FAST'25 conversation trace (12,031 requests, 512-token block hashes)",
        repo="kvcache-ai/Mooncake",
        commit="3cca71daccf2a7afb8fe3f0295358f70e3a69fdb",
        files=(UpstreamFile("FAST25-release/traces/conversation_trace.jsonl", 3029533,
                            "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"),),
        local="mooncake_conversation.jsonl",
        licence="Apache 2.0",
        attribution="kvcache-ai/Mooncake (Apache 2.0): keep the licence and notice with copies",
        sources=(("commit", "last commit touching the file (2025-02-21); " + _SNAPSHOT),
                 ("sha256", "byte-identical to ../shared/traces/mooncake_conversation.jsonl")),
    ),
    TraceSource(
        name="swebench_miniswe_agent",
        title="SWE-bench tasks run by mini-swe-agent (402 requests in 20 sessions, one JSONL file per session)",
        repo="LMCache/lmcache-agent-trace",
        commit="271d1c02f97d68de6b500bcd9c9b25730b1d4b7f",
        files=tuple(UpstreamFile(f"miniswe/{stem}.jsonl", size, digest) for stem, size, digest in _MINISWE_FILES),
        local="swebench_miniswe_agent",
        licence="Apache 2.0",
        attribution="LMCache/lmcache-agent-trace (Apache 2.0): keep the licence and notice with copies",
        aliases=("swebench_miniswe_agent.csv",),
        sources=(("commit", "the commit that added miniswe/ (2025-11-01, unchanged since); " + _SNAPSHOT),
                 ("aliases", "../shared/traces/swebench_miniswe_agent.csv is derived from these files "
                             "(character counts; the loaders give the same Trace from either)")),
    ),
)


def find(name: str) -> TraceSource | None:
    """The catalogued trace answering to ``name`` (catalogue name, local name or alias), else None."""
    for source in CATALOG:
        if name in source.names():
            return source
    return None


def get(name: str) -> TraceSource:
    """Like :func:`find`, but an unknown name is a :class:`ConfigError` listing the known ones."""
    source = find(name)
    if source is None:
        raise ConfigError(f"unknown trace {name!r}; catalogued traces: {', '.join(s.name for s in CATALOG)}")
    return source
