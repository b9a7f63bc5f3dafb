"""A generated docs site: realistic Markdown/MDX pages with YAML frontmatter, made from a seed.

~80% of pages are `public: true`, ~10% `groups: [admin]`, ~10% `groups: [billing]`. Sizes are
log-normal around 6 KB (`median_bytes`) with a tail to ~100 KB. Sections nest 1-4 levels deep under ~20 top-level
sections (a few hundred directories for 20,000 pages). The phrase "refresh token" is in ~2% of
pages and `Bearer <Word>` in a code sample of ~5%, so grep has realistic hits.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

_WORDS_TEXT = """
access account action adapter address agent alert alias allow analytics api app archive argument
audit authentication authorization backend backup balance batch billing branch browser buffer build
bundle cache callback certificate change channel charge check client cloud cluster code collection
command commit config connection console container context contract cookie credential customer
dashboard data database default delete deploy deployment device digest directory domain download
endpoint environment error event export feature field file filter flag format function gateway
group handler header health history host identity image import index input instance integration
invoice issuer job key label latency layer limit link list load locale log login metadata method
metric middleware migration mode model module monitor namespace network node notification object
option order organization origin output owner package page parameter partner password path payload
payment permission pipeline plan platform plugin policy pool port project provider proxy query
queue quota rate record redirect region release replica report repository request resource response
retry role route rule runtime sandbox schema scope script secret section server service session
setting signature snapshot source stage status storage stream subscription table tag task team
template tenant test threshold timeout token topic trace transaction trigger type upload usage user
value variable version webhook window worker workspace zone the a of to and in for with on by is
are be can when your this that from it as each every all new only after before then must should
"""
_SECTIONS_TEXT = """
getting-started guides api-reference concepts authentication billing integrations sdks cli
deployment security administration webhooks analytics data-export troubleshooting release-notes
platform tutorials best-practices
"""
WORDS = _WORDS_TEXT.split()
SECTIONS = _SECTIONS_TEXT.split()
LANGS = ["bash", "python", "javascript", "json", "yaml", "go"]
PUBLIC, ADMIN, BILLING = "public: true", "groups: [admin]", "groups: [billing]"


@dataclass
class GeneratedSite:
    root: Path
    pages: int
    dirs: int
    bytes: int


def _slug(rng: random.Random, n: int) -> str:
    return "-".join(rng.choice(WORDS[:240]) for _ in range(n))


def _sentence(rng: random.Random, lo: int = 6, hi: int = 18) -> str:
    words = rng.choices(WORDS, k=rng.randint(lo, hi))
    return " ".join(words).capitalize() + "."


def _paragraph(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(2, 6)))


def _block(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.45:
        return _paragraph(rng)
    if kind < 0.65:
        return "\n".join(f"- {_sentence(rng, 3, 9)}" for _ in range(rng.randint(2, 6)))
    if kind < 0.85:
        lang = rng.choice(LANGS)
        lines = [" ".join(rng.choices(WORDS, k=rng.randint(2, 8))) for _ in range(rng.randint(2, 10))]
        return f"```{lang}\n" + "\n".join(lines) + "\n```"
    header = rng.choices(WORDS, k=3)
    rows = [f"| {' | '.join(rng.choices(WORDS, k=3))} |" for _ in range(rng.randint(2, 6))]
    return "\n".join([f"| {' | '.join(header)} |", "|---|---|---|", *rows])


def page_text(rng: random.Random, target: int, refresh: bool, bearer: bool) -> str:
    title = _slug(rng, 3).replace("-", " ").title()
    access = rng.choices([PUBLIC, ADMIN, BILLING], weights=[80, 10, 10])[0]
    parts = [f'---\ntitle: "{title}"\ndescription: "{_sentence(rng, 5, 10)}"\n{access}\n---', f"# {title}"]
    size = sum(len(p) + 2 for p in parts)
    while size < target:
        block = f"## {_slug(rng, 2).replace('-', ' ').title()}" if rng.random() < 0.15 else _block(rng)
        parts.append(block)
        size += len(block) + 2
    if refresh:
        at = rng.randint(2, len(parts))
        parts.insert(at, f"Exchange the refresh token for a new {rng.choice(WORDS)} token before it expires.")
    if bearer:
        word = rng.choice(WORDS).capitalize()
        parts.insert(rng.randint(2, len(parts)), f'```bash\ncurl -H "Authorization: Bearer {word}" $API/v1\n```')
    return "\n\n".join(parts) + "\n"


def _directories(rng: random.Random, pages: int) -> list[str]:
    """~20 top-level sections, then subsections 2-4 levels deep up to ~20*sqrt(pages/50) dirs."""
    dirs = list(SECTIONS)
    target = max(len(SECTIONS), round(len(SECTIONS) * math.sqrt(max(pages, 1) / 50)))
    for _ in range(target - len(dirs)):
        parent = rng.choice([d for d in dirs if d.count("/") < 3] or dirs)
        dirs.append(f"{parent}/{_slug(rng, rng.randint(1, 2))}-{len(dirs)}")
    return dirs


MEDIAN_PAGE_BYTES = 6000


def generate(root: Path, pages: int, seed: int, median_bytes: int = MEDIAN_PAGE_BYTES) -> GeneratedSite:
    rng = random.Random(seed)
    dirs = _directories(rng, pages)
    weights = [1.0 / (1 + i % 37) for i in range(len(dirs))]
    total = 0
    used: set[str] = set()
    for number in range(pages):
        folder = rng.choices(dirs, weights=weights)[0]
        name = f"{_slug(rng, rng.randint(1, 3))}{rng.choice(['.md', '.mdx'])}"
        if f"{folder}/{name}" in used:
            name = f"{number}-{name}"
        used.add(f"{folder}/{name}")
        target = int(min(100_000, max(400, rng.lognormvariate(math.log(median_bytes), 0.85))))
        text = page_text(rng, target, refresh=rng.random() < 0.02, bearer=rng.random() < 0.05)
        path = root / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8")
        path.write_bytes(data)
        total += len(data)
    made = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()}
    return GeneratedSite(root, pages, len(made), total)
